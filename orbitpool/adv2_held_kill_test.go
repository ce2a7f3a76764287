package orbitpool

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

var (
	adv2HeldKey = Key{0xad2e, 0x4b}
	adv2HeldLim = Limits{MaxResources: 3, MaxCreating: 2}
)

func init() { mpMoreRoles["adv2-held-churner"] = adv2RoleHeldChurner }

// adv2RoleHeldChurner moves grants in and out of its lane's held word from
// 6 goroutines until killed: Acquire with deadlines that end about when a
// grant comes, Readiness users that are handed a unit and claim it, leave it
// or let it sit a little, creation permits held, registered, used and
// unregistered, so that a kill finds creation claims, live resources,
// waiters, undelivered and delivered grants in every state.
func adv2RoleHeldChurner(c *mpChildCtx) error {
	p, err := c.open()
	if err != nil {
		return err
	}
	var ops atomic.Int64
	use := func(rng *rand.Rand, cp *CreationPermit) {
		time.Sleep(time.Duration(rng.IntN(1000)) * time.Microsecond)
		if rng.IntN(2) == 0 {
			cp.Close()
			return
		}
		e, err := cp.RegisterAndAccept(1)
		if err != nil {
			return
		}
		time.Sleep(time.Duration(rng.IntN(500)) * time.Microsecond)
		e.Complete()
		p.Unregister(e.ID())
	}
	for g := range 6 {
		go func() {
			rng := rand.New(rand.NewPCG(c.args.Seed, uint64(g)))
			for {
				if rng.IntN(2) == 0 {
					ctx, cancel := context.WithTimeout(context.Background(), time.Duration(rng.IntN(3000))*time.Microsecond)
					plan, err := p.Acquire(ctx, adv2HeldKey, LocalOnly{}, adv2HeldLim)
					cancel()
					if err == nil {
						switch plan.Kind {
						case PlanCreate:
							use(rng, plan.Permit)
						case PlanReuseLocal:
							plan.Execution.Complete()
						}
					}
				} else if r, err := p.Watch(adv2HeldKey); err == nil {
					select {
					case <-r.Ready():
						if rng.IntN(4) == 0 {
							time.Sleep(time.Duration(rng.IntN(300)) * time.Microsecond)
						}
						if rng.IntN(3) == 0 {
							r.Close()
							break
						}
						cp, err := p.ClaimCreate(adv2HeldKey, adv2HeldLim)
						r.Close()
						if err == nil {
							use(rng, cp)
						}
					case <-time.After(time.Duration(rng.IntN(3000)) * time.Microsecond):
						r.Close()
					}
				}
				ops.Add(1)
			}
		}()
	}
	for ops.Load() < 200 {
		time.Sleep(time.Millisecond)
	}
	c.send(mpMsg{Type: "ready", Lane: p.Lane(), PID: os.Getpid()})
	c.untilParentLeaves()
	return nil
}

// TestAdv2HeldKillsLeaveNoWaiterBehind: two children churn one key's
// creation budget (MaxResources 3, MaxCreating 2) through Acquire and
// Readiness, and are SIGKILLed at random instants, round after round, while
// the parent's own waiters (deadline 3s, the same limits) wait in the same
// queue. A kill anywhere in sync leaves a held word, a queue word and
// creation claims behind; the reclaim must hand every freed unit on (now one
// per creation claim) and clear the held word, so no parent waiter ever runs
// out its 3s, and at the end the key is empty and its counters agree with
// the slots.
func TestAdv2HeldKillsLeaveNoWaiterBehind(t *testing.T) {
	opts := Options{ReconcileInterval: 10 * time.Millisecond, ReservationTimeout: 100 * time.Millisecond}
	p, spec := mpOpenParent(t, opts)
	s := p.seg
	var (
		stop      atomic.Bool
		wg        sync.WaitGroup
		served    atomic.Int64
		failMu    sync.Mutex
		failures  []string
		waitLongs atomic.Int64
	)
	for g := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), uint64(g)))
			for !stop.Load() {
				ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
				start := time.Now()
				plan, err := p.Acquire(ctx, adv2HeldKey, LocalOnly{}, adv2HeldLim)
				cancel()
				if err != nil {
					if we := (*WaitError)(nil); errors.As(err, &we) {
						waitLongs.Add(1)
						ref, _ := p.lookupKey(adv2HeldKey)
						c := atomic.LoadUint64(s.u64(s.keyOff(ref.idx) + kfCtl))
						failMu.Lock()
						failures = append(failures, fmt.Sprintf("parent waiter gave up after %v: %v; key now total %d creating %d, %d waiters", time.Since(start).Round(time.Millisecond), err, kTotal(c), kCreating(c), registeredWaiters(p, adv2HeldKey)))
						failMu.Unlock()
					}
					continue
				}
				served.Add(1)
				time.Sleep(time.Duration(rng.IntN(500)) * time.Microsecond)
				switch plan.Kind {
				case PlanCreate:
					plan.Permit.Close()
				case PlanReuseLocal:
					plan.Execution.Complete()
				}
			}
		}()
	}
	defer func() {
		stop.Store(true)
		wg.Wait()
	}()
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))
	rounds := mpScale(12, 5)
	args := mpArgs{Spec: spec, Reconcile: 10 * time.Millisecond, ResTimeout: 100 * time.Millisecond, Lifetime: 60 * time.Second}
	killRounds(t, p, "adv2-held-churner", args, rounds, rng, 100*time.Millisecond, nil)
	// The parent alone now: its waiters must keep being served.
	time.Sleep(200 * time.Millisecond)
	stop.Store(true)
	wg.Wait()
	failMu.Lock()
	defer failMu.Unlock()
	if len(failures) > 0 {
		t.Fatalf("%d parent waiters ran out their 3s deadline:\n%v", len(failures), failures)
	}
	snap, ok := mpWaitSnap(p, 3*time.Second, func(sn Snapshot) bool {
		ks := mpKS(sn, adv2HeldKey)
		return ks.Live == 0 && ks.Creating == 0 && ks.Waiting == 0 && ks.InUse == 0
	})
	if !ok {
		t.Fatalf("after %d rounds the key did not settle: %+v", rounds, mpKS(snap, adv2HeldKey))
	}
	ref, _ := p.lookupKey(adv2HeldKey)
	for l := range s.l.nlanes {
		if h, ok := s.heldOf(l, ref.idx); ok {
			t.Errorf("lane %d still names held ticket %d with no waiter left", l, h)
		}
	}
	t.Logf("%d rounds of 2 kills; parent served %d times", rounds, served.Load())
}
