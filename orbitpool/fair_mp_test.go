package orbitpool

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The fairness scenario: a key whose creation budget (MaxResources) is the
// fleet-wide cap, many goroutines in several processes acquiring it, holding
// what they got for a millisecond or few and giving it back. Budget is the
// capped thing because every process can take it without a remote exchange,
// so the order in which the fleet serves its waiters is all that is measured.

var mpKeyFair = Key{Hi: 0x6d70, Lo: 13}

var mpFairDuration = flag.Duration("orbitpool.fair", 5*time.Second, "how long BenchmarkMultiProcessFairness runs")

func init() { mpMoreRoles["fair"] = mpRoleFair }

// mpRoleFair runs Workers goroutines that acquire the key's budget until Dur
// has passed, and reports each acquisition as (arrival, service) instants of
// the host's monotonic clock, service 0 for one that timed out, and the p99
// of how late its goroutines woke from their holds: a service instant is
// recorded late by as much, which a loaded machine, or a virtual one whose
// idle CPUs halt, makes milliseconds.
func mpRoleFair(c *mpChildCtx) error {
	p, err := c.joinUntilGo()
	if err != nil {
		return err
	}
	defer p.Close()
	lim := Limits{MaxResources: c.args.Cap}
	end := mpMono() + int64(c.args.Dur)
	var (
		mu   sync.Mutex
		recs []int64
		bad  error
		wg   sync.WaitGroup
		late []time.Duration
	)
	for w := range c.args.Workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(c.args.Seed, uint64(w)))
			var (
				mine []int64
				woke []time.Duration
			)
			for mpMono() < end {
				// One acquisition in ten gives up after a few
				// milliseconds, as a request whose deadline is near.
				d := 10 * time.Second
				if rng.IntN(10) == 0 {
					d = time.Duration(1+rng.IntN(5)) * time.Millisecond
				}
				ctx, cancel := context.WithTimeout(context.Background(), d)
				arrive := mpMono()
				plan, err := p.Acquire(ctx, mpKeyFair, LocalOnly{}, lim)
				served := mpMono()
				cancel()
				var we *WaitError
				if errors.As(err, &we) {
					mine = append(mine, arrive, 0)
					continue
				}
				if err == nil && plan.Kind != PlanCreate {
					err = errors.New("plan " + plan.Kind.String() + ", want create")
				}
				if err != nil {
					mu.Lock()
					bad = err
					mu.Unlock()
					return
				}
				mine = append(mine, arrive, served)
				d = time.Duration(500+rng.IntN(2000)) * time.Microsecond
				start := mpMono()
				time.Sleep(d)
				woke = append(woke, time.Duration(mpMono()-start)-d)
				plan.Permit.Close()
			}
			mu.Lock()
			recs = append(recs, mine...)
			late = append(late, woke...)
			mu.Unlock()
		})
	}
	wg.Wait()
	if bad != nil {
		return bad
	}
	slices.Sort(late)
	c.send(mpMsg{Type: "records", Nanos: recs, Waited: late[len(late)*99/100]})
	c.untilParentLeaves()
	return nil
}

// joinUntilGo opens the pool, says it is ready and waits for the parent's
// "go".
func (c *mpChildCtx) joinUntilGo() (*Pool, error) {
	p, err := c.open()
	if err != nil {
		return nil, err
	}
	c.send(mpMsg{Type: "ready", Lane: p.Lane(), PID: os.Getpid()})
	if _, err := c.expect("go"); err != nil {
		p.Close()
		return nil, err
	}
	return p, nil
}

// fairStats summarises one run of the scenario.
type fairStats struct {
	served, timedOut int
	p50, p99, max    time.Duration // wait of the served acquisitions
	dispP99, dispMax int           // |service rank - arrival rank|
	overtaken        float64       // share served after one that arrived slack later
}

// fairSummary summarises a run's records; an acquisition counts as
// overtaken if one that arrived more than slack after it was served first.
func fairSummary(recs []int64, slack time.Duration) fairStats {
	type rec struct{ arrive, served int64 }
	var rs []rec
	var st fairStats
	for i := 0; i+1 < len(recs); i += 2 {
		if recs[i+1] == 0 {
			st.timedOut++
			continue
		}
		rs = append(rs, rec{recs[i], recs[i+1]})
	}
	st.served = len(rs)
	if len(rs) == 0 {
		return st
	}
	waits := make([]time.Duration, len(rs))
	for i, r := range rs {
		waits[i] = time.Duration(r.served - r.arrive)
	}
	slices.Sort(waits)
	st.p50, st.p99, st.max = waits[len(waits)/2], waits[len(waits)*99/100], waits[len(waits)-1]

	sort.Slice(rs, func(i, j int) bool { return rs[i].arrive < rs[j].arrive })
	byService := make([]int, len(rs))
	for i := range byService {
		byService[i] = i
	}
	sort.Slice(byService, func(i, j int) bool { return rs[byService[i]].served < rs[byService[j]].served })
	disp := make([]int, len(rs))
	for rank, i := range byService {
		disp[i] = max(rank-i, i-rank)
	}
	slices.Sort(disp)
	st.dispP99, st.dispMax = disp[len(disp)*99/100], disp[len(disp)-1]

	// later[j] is the earliest service among those that arrived at j or after.
	later := make([]int64, len(rs)+1)
	later[len(rs)] = 1<<63 - 1
	for j := len(rs) - 1; j >= 0; j-- {
		later[j] = min(later[j+1], rs[j].served)
	}
	over, j := 0, 0
	for i, r := range rs {
		for j < len(rs) && rs[j].arrive <= r.arrive+int64(slack) {
			j++
		}
		_ = i
		if later[j] < r.served {
			over++
		}
	}
	st.overtaken = float64(over) / float64(len(rs))
	return st
}

// mpFairRun runs the scenario with procs children of workers goroutines each
// on a key capped at cap units, for d, and returns every child's records and
// the longest of their p99 wake-up delays (see mpRoleFair).
func mpFairRun(t testing.TB, procs, workers, cap int, d time.Duration) (recs []int64, wake time.Duration) {
	p, spec := mpOpenParent(t, Options{ReconcileInterval: 100 * time.Millisecond})
	_ = p
	var kids []*mpChild
	for i := range procs {
		kids = append(kids, mpStart(t, "fair", mpArgs{Spec: spec, Reconcile: 100 * time.Millisecond, Workers: workers, Cap: cap, Dur: d, Seed: uint64(i + 1)}))
	}
	for _, c := range kids {
		c.expect("ready", 30*time.Second)
	}
	for _, c := range kids {
		c.send(mpMsg{Type: "go"})
	}
	for _, c := range kids {
		m := c.expect("records", d+60*time.Second)
		recs = append(recs, m.Nanos...)
		wake = max(wake, m.Waited)
	}
	for _, c := range kids {
		c.finish(10 * time.Second)
	}
	if _, ok := mpWaitSnap(p, 5*time.Second, func(s Snapshot) bool { return mpKS(s, mpKeyFair).Creating == 0 }); !ok {
		t.Errorf("the key's budget did not come back after the run")
	}
	return recs, wake
}

// fairSlack is how much later than a waiter an arrival must be for serving
// it first to count as overtaking: 5ms, and the run's p99 wake-up delay, by
// which a waiter's service instant may be recorded late. On this 2-core
// virtual machine a process woken on an idle CPU ran 10ms late at p99 (and
// 0.15ms with both CPUs busy; BenchmarkMultiProcWakeLatency), which made
// up to 10% of the acquisitions look overtaken at 5ms.
func fairSlack(wake time.Duration) time.Duration { return 5*time.Millisecond + wake }

// TestMultiProcessFairOrder: waiters of four processes are served in the
// order they arrived, whichever process they are in, while one acquisition in
// ten times out in the queue.
func TestMultiProcessFairOrder(t *testing.T) {
	recs, wake := mpFairRun(t, 4, 12, 16, mpScale(3*time.Second, 2*time.Second))
	slack := fairSlack(wake)
	st := fairSummary(recs, slack)
	t.Logf("served %d, timed out %d; wait p50 %v p99 %v max %v; order displacement p99 %d max %d; overtaken by an arrival %v later (wake-up p99 %v) %.2f%%",
		st.served, st.timedOut, st.p50, st.p99, st.max, st.dispP99, st.dispMax, slack, wake, 100*st.overtaken)
	if st.served < 500 {
		t.Fatalf("only %d acquisitions served", st.served)
	}
	// The base commit, which wakes a waiter per process and lets
	// newcomers take what comes back, had 23% here at 5ms. Below 1% with
	// the CPUs awake; late wake-ups are in the slack.
	if st.overtaken > 0.05 {
		t.Errorf("%.2f%% of the served acquisitions were overtaken by one that arrived %v after them, want at most 5%%", 100*st.overtaken, slack)
	}
}

// BenchmarkMultiProcessFairness reports the scenario's wait times and how far
// service order strays from arrival order: 4 processes × 16 goroutines on a
// key capped at 16 units, each held 0.5 to 2.5 ms.
func BenchmarkMultiProcessFairness(b *testing.B) {
	for b.Loop() {
		recs, wake := mpFairRun(b, 4, 16, 16, *mpFairDuration)
		st := fairSummary(recs, fairSlack(wake))
		b.ReportMetric(float64(st.served)/mpFairDuration.Seconds(), "served/s")
		b.ReportMetric(float64(st.p50.Microseconds()), "wait-p50-µs")
		b.ReportMetric(float64(st.p99.Microseconds()), "wait-p99-µs")
		b.ReportMetric(float64(st.max.Microseconds()), "wait-max-µs")
		b.ReportMetric(float64(st.dispP99), "displace-p99")
		b.ReportMetric(float64(st.dispMax), "displace-max")
		b.ReportMetric(100*st.overtaken, "overtaken-%")
		b.ReportMetric(float64(st.timedOut), "timeouts")
	}
}

var mpKeyFairKill = Key{Hi: 0x6d70, Lo: 14}

func init() { mpMoreRoles["fair-parker"] = mpRoleFairParker }

// mpRoleFairParker parks N acquisitions of the key on "go", and reports
// each one served (giving its unit straight back).
func mpRoleFairParker(c *mpChildCtx) error {
	p, err := c.joinUntilGo()
	if err != nil {
		return err
	}
	defer p.Close()
	for range c.args.N {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			plan, err := p.Acquire(ctx, c.args.Key, LocalOnly{}, Limits{MaxResources: c.args.Cap})
			if err != nil {
				c.fail("acquire: %v", err)
				return
			}
			c.send(mpMsg{Type: "served", T: mpMono()})
			plan.Permit.Close()
		}()
	}
	c.untilParentLeaves()
	return nil
}

// TestMultiProcessKilledGranteeHandsOn: the oldest waiters of a key are in a
// process that is stopped when the units they were handed come back, and
// then killed. Nothing else will give a unit back, so the younger waiters of
// another process are served only if reclaiming the dead lane hands its
// undelivered units on.
func TestMultiProcessKilledGranteeHandsOn(t *testing.T) {
	const n, capacity = 3, 3
	reconcile := 100 * time.Millisecond
	p, spec := mpOpenParent(t, Options{ReconcileInterval: reconcile})
	var permits []*CreationPermit
	for range capacity {
		cp, err := p.ClaimCreate(mpKeyFairKill, Limits{MaxResources: capacity})
		if err != nil {
			t.Fatal(err)
		}
		permits = append(permits, cp)
	}
	args := mpArgs{Spec: spec, Reconcile: reconcile, Key: mpKeyFairKill, N: n, Cap: capacity}
	victim := mpStart(t, "fair-parker", args)
	survivor := mpStart(t, "fair-parker", args)
	victim.expect("ready", 30*time.Second)
	survivor.expect("ready", 30*time.Second)
	for i, c := range []*mpChild{victim, survivor} {
		c.send(mpMsg{Type: "go"})
		if snap, ok := mpWaitSnap(p, 10*time.Second, func(s Snapshot) bool { return mpKS(s, mpKeyFairKill).Waiting == n*(i+1) }); !ok {
			t.Fatalf("waiters did not park: %+v", mpKS(snap, mpKeyFairKill))
		}
	}
	if err := syscall.Kill(victim.pid(), syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	mpUntilStopped(t, victim.pid())
	for _, cp := range permits {
		cp.Close()
	}
	// The units went to the victim's waiters, the oldest: the survivor's
	// stay parked.
	time.Sleep(50 * time.Millisecond)
	if m, ok := survivor.tryRecv(); ok {
		t.Fatalf("a younger waiter was served while the older ones held the units: %+v", m)
	}
	victim.kill()
	t0 := mpMono()
	for i := range n {
		m := survivor.expect("served", 10*time.Second)
		if i == n-1 {
			t.Logf("the survivor's %d waiters were served %v after the kill (reconcile interval %v)", n, time.Duration(m.T-t0), reconcile)
		}
	}
	survivor.finish(10 * time.Second)
	if snap, ok := mpWaitSnap(p, 5*time.Second, func(s Snapshot) bool {
		ks := mpKS(s, mpKeyFairKill)
		return ks.Creating == 0 && ks.Waiting == 0
	}); !ok {
		t.Errorf("after the run: %+v, want no claims and no waiters", mpKS(snap, mpKeyFairKill))
	}
}

// mpUntilStopped waits until every thread of process pid is stopped: a
// SIGSTOP reaches the threads of a busy host one by one.
func mpUntilStopped(t testing.TB, pid int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/stat", pid))
		stopped := len(tasks) > 0
		for _, f := range tasks {
			b, err := os.ReadFile(f)
			// The state follows the command name, which is in parentheses.
			if i := bytes.LastIndexByte(b, ')'); err != nil || i < 0 || i+2 >= len(b) || (b[i+2] != 'T' && b[i+2] != 't') {
				stopped = false
			}
		}
		if stopped {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("process %d not stopped 10s after SIGSTOP", pid)
		}
		time.Sleep(time.Millisecond)
	}
}
