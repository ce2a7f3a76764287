package orbitpool

import (
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// winWaiter is one Acquire parked in a lane; seq is its arrival order, which
// is its ticket order because each arrival is waited for before the next.
type winWaiter struct {
	seq    int
	lane   int
	cancel context.CancelFunc
	res    chan fairResult
}

// winFleet is several pools on one segment, each its own lane, in-process.
type winFleet struct {
	t    *testing.T
	spec PoolSpec
	ps   []*Pool
	k    Key
	seq  int
}

func newWinFleet(t *testing.T, lanes, pools int, windows func(i int) uint32) *winFleet {
	t.Helper()
	f := &winFleet{t: t, k: Key{0x77696e, uint64(lanes)}}
	f.spec = PoolSpec{Path: filepath.Join(t.TempDir(), "seg"), Lanes: lanes, Keys: 8, ResourcesPerLane: 16}
	for i := range pools {
		p, err := Open(f.spec, Options{ReconcileInterval: time.Hour, ReservationTimeout: time.Hour, OrderWindow: windows(i)})
		if err != nil {
			t.Fatal(err)
		}
		f.ps = append(f.ps, p)
	}
	t.Cleanup(func() {
		for _, p := range f.ps {
			if p != nil {
				p.Close()
			}
		}
	})
	return f
}

// registered is how many waiters the table shows on the key, all lanes.
func (f *winFleet) registered() int { return registeredWaiters(f.ps[0], f.k) }

func (f *winFleet) waitRegistered(want int) {
	f.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for f.registered() != want {
		if time.Now().After(deadline) {
			f.t.Fatalf("%d waiters registered, want %d", f.registered(), want)
		}
		time.Sleep(50 * time.Microsecond)
	}
}

// arrive parks one Acquire in pool i and waits until it is registered.
func (f *winFleet) arrive(i int, pol Policy, lim Limits) *winWaiter {
	f.t.Helper()
	before := f.registered()
	ctx, cancel := context.WithCancel(context.Background())
	w := &winWaiter{seq: f.seq, lane: f.ps[i].lane, cancel: cancel, res: make(chan fairResult, 1)}
	f.seq++
	go func(p *Pool) {
		plan, err := p.Acquire(ctx, f.k, pol, lim)
		w.res <- fairResult{plan, err}
	}(f.ps[i])
	f.waitRegistered(before + 1)
	select {
	case r := <-w.res:
		f.t.Fatalf("waiter %d was served on arrival: %v %v", w.seq, r.plan.Kind, r.err)
	default:
	}
	return w
}

// passedBeyond returns the pairs (served younger, unserved older) whose
// ticket distance is more than window.
func passedBeyond(served, unserved []*winWaiter, window int) []string {
	var bad []string
	for _, s := range served {
		for _, u := range unserved {
			if s.seq-u.seq > window {
				bad = append(bad, fmt.Sprintf("waiter %d (lane %d) served while %d (lane %d) waits", s.seq, s.lane, u.seq, u.lane))
			}
		}
	}
	return bad
}

// collect waits settle, then splits ws into served and still waiting.
func collect(ws []*winWaiter, settle time.Duration) (served, unserved []*winWaiter, plans []Plan) {
	time.Sleep(settle)
	for _, w := range ws {
		select {
		case r := <-w.res:
			if r.err == nil {
				served = append(served, w)
				plans = append(plans, r.plan)
			}
		default:
			unserved = append(unserved, w)
		}
	}
	return
}

// TestAdvWindowMultiUnitWakeBound: one call that hands out several units at
// once (SetCapacity raising a resource, as an HTTP/2 SETTINGS frame does;
// also Register with capacity > 1, reclaim's regrants and recount) from a
// process whose own lane holds many waiters. laneNext names a lane's third
// waiting ticket for every grant past the second, so a lane whose grants
// were delivered only after the whole loop ranked by its third waiter from
// the fourth unit on, past an older waiter elsewhere; the giver's own lane
// is delivered at once now. Such units are room, but not a use given back:
// they go in strict order whatever the window.
//
// "window=4": lane A (pool 0) has waiter 0; lane B (pool 1) has waiters
// 1..12 and raises a resource from capacity 0 to 6: waiter 0 must be
// served. "strict": B has 0, 1, 2 and 4..12, A has 3; B raises 4 units:
// 0..3 must be served.
func TestAdvWindowMultiUnitWakeBound(t *testing.T) {
	for _, tc := range []struct {
		name   string
		window uint32
		aAt    int // the arrival index of lane A's one waiter
		n      int // units raised
	}{
		{"window=4", 4, 0, 6},
		{"strict", 0, 3, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newWinFleet(t, 4, 2, func(int) uint32 { return tc.window })
			pa, pb := f.ps[0], f.ps[1]
			id, err := pb.Register(f.k, 1)
			if err != nil {
				t.Fatal(err)
			}
			if err := pb.SetCapacity(id, 0); err != nil {
				t.Fatal(err)
			}
			lim := Limits{MaxResources: 1}
			var ws []*winWaiter
			for i := range 13 {
				pool := 1
				if i == tc.aAt {
					pool = 0
				}
				ws = append(ws, f.arrive(pool, LocalFirst{}, lim))
			}
			_ = pa
			if err := pb.SetCapacity(id, tc.n); err != nil {
				t.Fatal(err)
			}
			served, unserved, _ := collect(ws, 300*time.Millisecond)
			defer func() {
				for _, w := range ws {
					w.cancel()
				}
			}()
			var got []int
			for _, s := range served {
				got = append(got, s.seq)
			}
			sort.Ints(got)
			if len(served) != tc.n {
				t.Errorf("%d units raised, %d waiters served: %v", tc.n, len(served), got)
			}
			if bad := passedBeyond(served, unserved, int(tc.window)); len(bad) > 0 {
				t.Errorf("window %d: served %v; passed beyond the window:\n  %s", tc.window, got, strings.Join(bad, "\n  "))
			}
		})
	}
}

// TestAdvWindowModelManyLanes is the reference model of TestModelTicketOrder
// on a fleet of 256 lanes whose live lanes straddle the mask words (0, 1, 63,
// 64, 65, 127, 128, 200, 255), each pool with its own window (0, 1, 3 or 8),
// with the key's ticket counter started just below 2^32 so that tickets wrap
// in their 32-bit comparison, and with waiters that cancel (gaps). The units
// are creation budget, which the windows must not move: each unit given back
// must go to exactly the fleet's oldest waiter.
func TestAdvWindowModelManyLanes(t *testing.T) {
	for seed := range uint64(3) {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) { advWindowModel(t, seed, 256, []int{0, 1, 63, 64, 65, 127, 128, 200, 255}) })
	}
	t.Run("lanes=64", func(t *testing.T) { advWindowModel(t, 7, 64, []int{0, 1, 31, 62, 63}) })
}

func advWindowModel(t *testing.T, seed uint64, lanes int, use []int) {
	const capacity, steps = 3, 220
	rng := rand.New(rand.NewPCG(seed, 0x77))
	windows := make([]uint32, lanes)
	choices := []uint32{0, 1, 3, 8}
	for i := range windows {
		windows[i] = choices[rng.IntN(len(choices))]
	}
	f := newWinFleet(t, lanes, use[len(use)-1]+1, func(i int) uint32 { return windows[i] })
	keep := map[int]bool{}
	for _, l := range use {
		keep[l] = true
	}
	var live []int // pool indexes in use; pool i has lane i
	for i, p := range f.ps {
		if p.lane != i {
			t.Fatalf("pool %d got lane %d", i, p.lane)
		}
		if !keep[i] {
			p.Close()
			f.ps[i] = nil
		} else {
			live = append(live, i)
		}
	}
	// f.registered reads through ps[0], which is kept.
	ref, err := f.ps[0].internKey(f.k)
	if err != nil {
		t.Fatal(err)
	}
	// Tickets start 20 below 2^32: the model's waiters straddle the wrap.
	atomic.StoreUint64(f.ps[0].seg.u64(f.ps[0].seg.keyOff(ref.idx)+kfTicket), 1<<32-20)
	lim := Limits{MaxResources: capacity}
	type held struct {
		pool int
		cp   *CreationPermit
	}
	var (
		queue []*winWaiter
		hs    []held
		trace []string
	)
	defer func() {
		if t.Failed() {
			t.Logf("windows of live pools: %v", func() (s []string) {
				for _, i := range live {
					s = append(s, fmt.Sprintf("%d:%d", i, windows[i]))
				}
				return
			}())
			t.Logf("trace:\n%s", strings.Join(trace, "\n"))
		}
		for _, w := range queue {
			w.cancel()
			<-w.res
		}
		for _, h := range hs {
			h.cp.Close()
		}
	}()
	take := func(step int, w *winWaiter, why string) {
		t.Helper()
		select {
		case r := <-w.res:
			if r.err != nil || r.plan.Kind != PlanCreate {
				t.Fatalf("step %d (%s): waiter %d got %v %v", step, why, w.seq, r.plan.Kind, r.err)
			}
			hs = append(hs, held{w.lane, r.plan.Permit})
		case <-time.After(5 * time.Second):
			var others []string
			for _, x := range queue {
				if len(x.res) > 0 {
					others = append(others, fmt.Sprintf("%d (lane %d)", x.seq, x.lane))
				}
			}
			t.Fatalf("step %d (%s): waiter %d (lane %d) was not served; served instead: %v", step, why, w.seq, w.lane, others)
		}
	}
	nobodyElse := func(step int, why string) {
		t.Helper()
		f.waitRegistered(len(queue))
		time.Sleep(2 * time.Millisecond)
		for _, x := range queue {
			if len(x.res) > 0 {
				r := <-x.res
				t.Fatalf("step %d (%s): waiter %d (lane %d) served out of turn: %v %v", step, why, x.seq, x.lane, r.plan.Kind, r.err)
			}
		}
	}
	for step := range steps {
		var ids []string
		for _, w := range queue {
			ids = append(ids, fmt.Sprintf("%d@%d", w.seq, w.lane))
		}
		trace = append(trace, fmt.Sprintf("step %d: queue %v held %d", step, ids, len(hs)))
		switch op := rng.IntN(10); {
		case op < 4 && len(queue) < 12:
			i := live[rng.IntN(len(live))]
			if len(hs) < capacity && len(queue) == 0 {
				// Served at once, no ticket.
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				plan, err := f.ps[i].Acquire(ctx, f.k, LocalOnly{}, lim)
				cancel()
				if err != nil || plan.Kind != PlanCreate {
					t.Fatalf("step %d: arrival with room: %v %v", step, plan.Kind, err)
				}
				hs = append(hs, held{i, plan.Permit})
				trace = append(trace, fmt.Sprintf("  lane %d served on arrival", i))
				continue
			}
			w := f.arrive(i, LocalOnly{}, lim)
			trace = append(trace, fmt.Sprintf("  arrive %d lane %d", w.seq, i))
			queue = append(queue, w)
			nobodyElse(step, "arrival")
		case op < 7 && len(hs) > 0:
			j := rng.IntN(len(hs))
			h := hs[j]
			hs = append(hs[:j], hs[j+1:]...)
			trace = append(trace, fmt.Sprintf("  give back lane %d (window %d)", h.pool, windows[h.pool]))
			if err := h.cp.Close(); err != nil {
				t.Fatal(err)
			}
			if len(queue) > 0 {
				// Creation budget goes in strict order, whatever
				// the giver's window.
				w := queue[0]
				queue = queue[1:]
				take(step, w, "give back")
				w.cancel()
			}
			nobodyElse(step, "give back")
		case op < 9 && len(queue) > 0:
			j := rng.IntN(len(queue))
			w := queue[j]
			queue = append(queue[:j], queue[j+1:]...)
			trace = append(trace, fmt.Sprintf("  cancel %d", w.seq))
			w.cancel()
			select {
			case r := <-w.res:
				if r.err == nil {
					hs = append(hs, held{w.lane, r.plan.Permit})
					t.Fatalf("step %d: cancelled waiter %d was served", step, w.seq)
				}
			case <-time.After(5 * time.Second):
				t.Fatalf("step %d: cancelled waiter %d did not return", step, w.seq)
			}
			nobodyElse(step, "cancel")
		}
	}
	// The counter must have wrapped past 2^32 for the test to mean anything.
	if tk := atomic.LoadUint64(f.ps[0].seg.u64(f.ps[0].seg.keyOff(ref.idx) + kfTicket)); tk < 1<<32 {
		t.Errorf("ticket counter %#x never crossed 2^32", tk)
	}
}

func winServed(t *testing.T, w *winWaiter, d time.Duration, why string) *CreationPermit {
	t.Helper()
	select {
	case r := <-w.res:
		if r.err != nil || r.plan.Kind != PlanCreate {
			t.Fatalf("%s: waiter %d got %v %v, want a creation permit", why, w.seq, r.plan.Kind, r.err)
		}
		return r.plan.Permit
	case <-time.After(d):
		t.Fatalf("%s: waiter %d (lane %d) still asleep %v after its unit came back", why, w.seq, w.lane, d)
	}
	return nil
}

// TestAdvWindowChurnCapAndLiveness: pools on lanes in three mask words (0,
// 64, 65, 129 of 130), each with its own window (0, 1, 16 and 1<<31), churn
// a key capped at 4 creation units: patient acquisitions, impatient ones that
// time out in the queue, and registrations (Watch) that leave without
// acquiring, with the ticket counter crossing 2^32. The units held never
// exceed the cap, a patient waiter never times out (holds are at most
// 300µs), the units are not left free while waiters sleep, and afterwards
// every unit is there. The Watch registrations leave without the re-check
// the Readiness doc asks for (see TestAdvReadinessLeftWithoutRecheck).
func TestAdvWindowChurnCapAndLiveness(t *testing.T) {
	advWindowChurn(t, []uint32{0, 1, 16, 1 << 31})
}

func advWindowChurn(t *testing.T, wins []uint32) {
	const capacity = 4
	lanes := []int{0, 64, 65, 129}
	f := newWinFleet(t, 130, 130, func(i int) uint32 { return wins[i%len(wins)] })
	var ps []*Pool
	for i, p := range f.ps {
		if !slices.Contains(lanes, i) {
			p.Close()
			f.ps[i] = nil
		} else {
			ps = append(ps, p)
		}
	}
	ref, err := f.ps[0].internKey(f.k)
	if err != nil {
		t.Fatal(err)
	}
	const start = 1<<32 - 200
	atomic.StoreUint64(f.ps[0].seg.u64(f.ps[0].seg.keyOff(ref.idx)+kfTicket), start)
	lim := Limits{MaxResources: capacity}
	var (
		inUse, maxUse, served, impatient, watched atomic.Int64
		lost                                      atomic.Int64
		firstLost                                 atomic.Value
	)
	d := mpScale(1500*time.Millisecond, 700*time.Millisecond)
	stop := time.Now().Add(d)
	done := make(chan struct{})
	var n atomic.Int32
	const workers = 24
	for g := range workers {
		n.Add(1)
		go func() {
			defer func() {
				if n.Add(-1) == 0 {
					close(done)
				}
			}()
			rng := rand.New(rand.NewPCG(uint64(g), 0x5757))
			p := ps[g%len(ps)]
			for time.Now().Before(stop) {
				switch op := rng.IntN(10); {
				case op == 0: // register and leave, without re-checking
					r, err := p.Watch(f.k)
					if err != nil {
						lost.Add(1)
						firstLost.CompareAndSwap(nil, fmt.Sprint("watch: ", err))
						continue
					}
					select {
					case <-r.Ready():
					case <-time.After(time.Duration(rng.IntN(300)) * time.Microsecond):
					}
					r.Close()
					watched.Add(1)
				default:
					patient := op > 2
					dl := 3 * time.Second
					if !patient {
						dl = time.Duration(50+rng.IntN(500)) * time.Microsecond
					}
					ctx, cancel := context.WithTimeout(context.Background(), dl)
					plan, err := p.Acquire(ctx, f.k, LocalOnly{}, lim)
					cancel()
					if err != nil {
						if patient {
							lost.Add(1)
							firstLost.CompareAndSwap(nil, fmt.Sprintf("lane %d: %v", p.lane, err))
						} else {
							impatient.Add(1)
						}
						continue
					}
					if plan.Kind != PlanCreate {
						lost.Add(1)
						firstLost.CompareAndSwap(nil, fmt.Sprint("plan ", plan.Kind))
						continue
					}
					u := inUse.Add(1)
					for m := maxUse.Load(); u > m && !maxUse.CompareAndSwap(m, u); m = maxUse.Load() {
					}
					time.Sleep(time.Duration(rng.IntN(300)) * time.Microsecond)
					inUse.Add(-1)
					plan.Permit.Close()
					served.Add(1)
				}
			}
		}()
	}
	// A monitor: the key's creation units free (Creating < cap) while
	// goroutines wait on it, continuously for 400ms (a loaded machine stalls
	// for less), is a unit left idle
	// behind a sleeping queue.
	var idleMax time.Duration
	var idleAt string
	monDone := make(chan struct{})
	go func() {
		defer close(monDone)
		var since time.Time
		for time.Now().Before(stop) {
			snap, err := ps[0].Snapshot()
			if err != nil {
				continue
			}
			ks := mpKS(snap, f.k)
			if ks.Creating+ks.Live < capacity && ks.Waiting > 0 && inUse.Load() < capacity {
				if since.IsZero() {
					since = time.Now()
				} else if dd := time.Since(since); dd > idleMax {
					idleMax = dd
					idleAt = fmt.Sprintf("%+v unclaimed %d", ks, atomic.LoadUint64(f.ps[0].seg.u64(f.ps[0].seg.keyOff(ref.idx)+kfUnclaimed)))
				}
			} else {
				since = time.Time{}
			}
			time.Sleep(200 * time.Microsecond)
		}
	}()
	defer func() {
		<-monDone
		if idleMax > 400*time.Millisecond {
			t.Errorf("capacity free while waiters slept for %v: %s", idleMax, idleAt)
		}
	}()
	select {
	case <-done:
	case <-time.After(d + 10*time.Second):
		t.Fatalf("workers did not finish: %d left (served %d)", n.Load(), served.Load())
	}
	t.Logf("served %d, impatient timeouts %d, watches %d, max in use %d", served.Load(), impatient.Load(), watched.Load(), maxUse.Load())
	if m := maxUse.Load(); m > capacity {
		t.Errorf("%d units in use at once, cap %d", m, capacity)
	}
	if l := lost.Load(); l > 0 {
		ks := keyStats(t, ps[0], f.k)
		t.Logf("key stats at the end: %+v; unclaimed %d", ks, atomic.LoadUint64(f.ps[0].seg.u64(f.ps[0].seg.keyOff(ref.idx)+kfUnclaimed)))
		t.Errorf("%d patient acquisitions failed; first: %v", l, firstLost.Load())
	}
	if served.Load() < 50 {
		t.Errorf("only %d served", served.Load())
	}
	if tk := atomic.LoadUint64(f.ps[0].seg.u64(f.ps[0].seg.keyOff(ref.idx) + kfTicket)); tk < 1<<32 {
		t.Errorf("ticket counter %#x never crossed 2^32", tk)
	}
	// Every unit is back: cap acquisitions succeed at once, the next waits.
	var cps []*CreationPermit
	for i := range capacity {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		plan, err := ps[i%len(ps)].Acquire(ctx, f.k, LocalOnly{}, lim)
		cancel()
		if err != nil {
			t.Fatalf("unit %d of %d lost after the churn: %v", i+1, capacity, err)
		}
		cps = append(cps, plan.Permit)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	if plan, err := ps[0].Acquire(ctx, f.k, LocalOnly{}, lim); err == nil {
		t.Errorf("a unit beyond the cap: %v", plan.Kind)
		plan.Permit.Close()
	}
	cancel()
	for _, cp := range cps {
		cp.Close()
	}
}

// TestAdvReadinessLeftWithoutRecheck (strict order, one process): a
// Readiness is the key's oldest registration while capacity is free.
// Acquisitions that arrive after it queue behind it and sleep (it is older
// and not handed anything). When it Closes, the next waiter must get a look,
// or they sleep with the capacity free. "recheck-took-one": it re-checks as
// its doc asks, finds one of two units and uses it, as Acquire's own path
// would. "no-recheck": it leaves before re-checking (a select loop whose
// context ended).
func TestAdvReadinessLeftWithoutRecheck(t *testing.T) {
	for _, tc := range []struct {
		name    string
		recheck bool
	}{{"no-recheck", false}, {"recheck-took-one", true}} {
		t.Run(tc.name, func(t *testing.T) {
			f := newWinFleet(t, 4, 1, func(int) uint32 { return 0 })
			p := f.ps[0]
			lim := Limits{MaxResources: 2}
			r, err := p.Watch(f.k)
			if err != nil {
				t.Fatal(err)
			}
			f.waitRegistered(1)
			f.seq++
			var cp *CreationPermit
			if tc.recheck {
				if cp, err = p.ClaimCreate(f.k, lim); err != nil {
					t.Fatalf("re-check: %v", err)
				}
				defer cp.Close()
			}
			w := f.arrive(0, LocalOnly{}, lim)
			defer w.cancel()
			r.Close()
			if got := winServed(t, w, 2*time.Second, "after the older Readiness closed"); got != nil {
				got.Close()
			}
		})
	}
}
