package orbitpool

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"
)

func init() { mpMoreRoles["adv2-claimer"] = adv2RoleClaimer }

// adv2RoleClaimer claims args.N creation permits of args.Key and registers
// args.Cap of them as resources it keeps busy, then waits to be killed.
func adv2RoleClaimer(c *mpChildCtx) error {
	p, err := c.open()
	if err != nil {
		return err
	}
	lim := Limits{MaxResources: c.args.N, MaxCreating: c.args.N}
	var keep []any
	for i := range c.args.N {
		cp, err := p.ClaimCreate(c.args.Key, lim)
		if err != nil {
			return fmt.Errorf("claim %d: %w", i, err)
		}
		if i < c.args.Cap {
			e, err := cp.RegisterAndAccept(1)
			if err != nil {
				return err
			}
			keep = append(keep, e)
		} else {
			keep = append(keep, cp)
		}
	}
	c.send(mpMsg{Type: "ready", Lane: p.Lane(), PID: os.Getpid(), N: len(keep)})
	c.untilParentLeaves()
	return nil
}

// TestAdv2HeldRecountOneUnitPerClaim: a killed process that held creation
// claims and busy resources of a key gives back one unit per resource or
// claim, no more and no fewer: with the parent's waiters parked behind the
// key's limits, exactly that many are served once the lane is reclaimed,
// the rest are served as those give their units back, and none is left
// parked with the budget free.
func TestAdv2HeldRecountOneUnitPerClaim(t *testing.T) {
	for _, tc := range []struct {
		name     string
		claims   int // the child's, all of the key's budget
		live     int // of which registered and busy
		lim      Limits
		waiters  int
		expected int
	}{
		{"creating-limit", 2, 0, Limits{MaxCreating: 2}, 3, 2},
		{"budget-claims", 2, 0, Limits{MaxResources: 2, MaxCreating: 2}, 3, 2},
		{"budget-mixed", 3, 1, Limits{MaxResources: 3, MaxCreating: 2}, 4, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := Options{ReconcileInterval: 10 * time.Millisecond, ReservationTimeout: time.Second}
			p, spec := mpOpenParent(t, opts)
			k := Key{0xad2e, 0x4c}
			c := mpStart(t, "adv2-claimer", mpArgs{Spec: spec, Reconcile: 10 * time.Millisecond, ResTimeout: time.Second, Key: k, N: tc.claims, Cap: tc.live})
			c.expect("ready", 30*time.Second)
			var res []<-chan mpPlanResult
			for i := range tc.waiters {
				res = append(res, adv2AcquireLocalOnly(p, 10*time.Second, k, tc.lim))
				waitFor(t, func() bool { return registeredWaiters(p, k) == i+1 })
			}
			// A resource that goes live is a creation claim no more: MaxCreating
			// binds only the claims, and the live one counts in the budget.
			c.kill()
			// The claims come back as tc.claims units, handed to the
			// tc.claims oldest waiters; the limits let tc.expected of them
			// create now, whichever wins (the documented race among
			// grantees of more units than there are).
			served := make([]bool, tc.waiters)
			var got []Plan
			collect := func(d time.Duration) int {
				n := 0
				deadline := time.Now().Add(d)
				for time.Now().Before(deadline) {
					for i, ch := range res {
						select {
						case r := <-ch:
							if r.err != nil {
								t.Fatalf("waiter %d: %v", i, r.err)
							}
							served[i] = true
							got = append(got, r.plan)
							n++
						default:
						}
					}
					time.Sleep(time.Millisecond)
				}
				return n
			}
			if n := collect(500 * time.Millisecond); n != tc.expected {
				t.Fatalf("%d waiters served after the kill, want %d (served %v, key %+v)", n, tc.expected, served, keyStats(t, p, k))
			}
			for i := tc.claims; i < tc.waiters; i++ {
				if served[i] {
					t.Fatalf("waiter %d served, but only the %d oldest were handed the %d units (served %v)", i, tc.claims, tc.claims, served)
				}
			}
			// Each unit that comes back serves one more, until all are.
			for left := tc.waiters - tc.expected; left > 0; left-- {
				got[0].Permit.Close()
				got = got[1:]
				if n := collect(300 * time.Millisecond); n != 1 {
					t.Fatalf("%d waiters served after a unit came back, want 1 (served %v, key %+v)", n, served, keyStats(t, p, k))
				}
			}
			for _, pl := range got {
				pl.Permit.Close()
			}
		})
	}
}

func adv2AcquireLocalOnly(p *Pool, d time.Duration, k Key, lim Limits) <-chan mpPlanResult {
	ch := make(chan mpPlanResult, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		plan, err := p.Acquire(ctx, k, LocalOnly{}, lim)
		ch <- mpPlanResult{plan, err, time.Now()}
	}()
	return ch
}
