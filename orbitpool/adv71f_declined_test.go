package orbitpool

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// TestAdv71fDeclinedUnitGoesOn: the oldest waiter of the fleet (a LocalOnly
// acquisition in a process with no resource of the key, lane 129) is handed
// the unit a sibling's resource got back, takes it, and can not use it (its
// try ends in errWait: the room is remote). A younger waiter of another
// process (LocalFirst, lane 70), which could, defers to it. When the oldest
// waiter's acquisition ends, by its deadline or its pool's Close, the room
// is still there and the younger waiter must be handed it.
//
// While the oldest waiter stays, the younger one waits behind it: strict
// order with a policy that declines what it is handed (see Policy).
func TestAdv71fDeclinedUnitGoesOn(t *testing.T) {
	for _, how := range []string{"deadline", "close"} {
		t.Run(how, func(t *testing.T) {
			spec := PoolSpec{Path: filepath.Join(t.TempDir(), "seg"), Lanes: 130, Keys: 4, ResourcesPerLane: 2}
			opts := Options{ReconcileInterval: time.Hour, ReservationTimeout: time.Hour}
			open := opener(t, spec, opts)
			var ps []*Pool
			for range 130 {
				ps = append(ps, open())
			}
			o, a, b := ps[3], ps[129], ps[70]
			k := Key{0xad71f, 20}
			lim := Limits{MaxResources: 1}
			pl, err := o.Acquire(context.Background(), k, LocalFirst{}, lim)
			if err != nil || pl.Kind != PlanCreate {
				t.Fatalf("owner's creation: %v %v", pl.Kind, err)
			}
			e, err := pl.Permit.RegisterAndAccept(1)
			if err != nil {
				t.Fatal(err)
			}
			ref, _ := o.lookupKey(k)
			s := o.seg
			waiting := func(p *Pool) int { return qWaiting(atomic.LoadUint64(s.u64(s.queueOff(p.Lane(), ref.idx)))) }
			waitFor := func(what string, cond func() bool) {
				t.Helper()
				for end := time.Now().Add(5 * time.Second); !cond(); time.Sleep(time.Millisecond) {
					if time.Now().After(end) {
						t.Fatalf("timed out waiting for %s", what)
					}
				}
			}
			aCtx, aCancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer aCancel()
			aRes := make(chan error, 1)
			go func() {
				pl, err := a.Acquire(aCtx, k, LocalOnly{}, lim)
				if err == nil {
					err = fmt.Errorf("acquired %v", pl.Kind)
				}
				aRes <- err
			}()
			waitFor("a's waiter", func() bool { return waiting(a) == 1 })
			bRes := make(chan error, 1)
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				pl, err := b.Acquire(ctx, k, LocalFirst{}, lim)
				if err == nil && pl.Kind == PlanReuseRemote {
					o.Withdraw(pl.Lease)
				} else if err == nil {
					err = fmt.Errorf("acquired %v", pl.Kind)
				}
				bRes <- err
			}()
			waitFor("b's waiter", func() bool { return waiting(b) == 1 })
			// The unit comes back and goes to a's waiter, the oldest,
			// which takes it (its queue word counts it no more) and
			// declines it.
			e.Complete()
			waitFor("a's waiter to take its unit", func() bool {
				q := atomic.LoadUint64(s.u64(s.queueOff(a.Lane(), ref.idx)))
				return qGrants(q) == 0 && qWaiting(q) == 1
			})
			time.Sleep(50 * time.Millisecond) // its try, LocalOnly: nothing here
			switch how {
			case "deadline":
				aCancel()
			case "close":
				if err := a.Close(); err != nil {
					t.Fatal(err)
				}
			}
			if err := <-aRes; err == nil || !(errors.Is(err, context.Canceled) || errors.Is(err, ErrClosed)) {
				t.Fatalf("a: %v", err)
			}
			if err := <-bRes; err != nil {
				t.Fatalf("the room a's waiter was handed and declined was never passed on to b's waiter after a's acquisition ended (%s): %v", how, err)
			}
		})
	}
}
