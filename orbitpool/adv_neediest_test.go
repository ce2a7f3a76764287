package orbitpool

import (
	"context"
	"testing"
	"time"
)

// TestAdvUnregisterTowardGoneLane: A holds both units of a key; B's
// waiter, then C's, wait. C leaves (its waiter gives up, then its pool
// closes) between Neediest and UnregisterToward. The unit must reach B's
// waiter, not be lost. Then, with C's waiter granted but cancelled before it
// takes the unit, the unit must be passed on.
func TestAdvUnregisterTowardGoneLane(t *testing.T) {
	for _, closeLane := range []bool{true, false} {
		f := newWinFleet(t, 4, 3, func(int) uint32 { return 16 })
		pa, pc := f.ps[0], f.ps[2]
		lim := Limits{MaxResources: 2}
		var ids []ResourceID
		for range 2 {
			id, err := pa.Register(f.k, 1)
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, id)
			if _, err := pa.Acquire(context.Background(), f.k, LocalOnly{}, lim); err != nil {
				t.Fatal(err)
			}
		}
		wb := f.arrive(1, LocalFirst{}, lim)
		wc := f.arrive(2, LocalFirst{}, lim)
		defer wb.cancel()
		lane, _, _, ok := pa.Neediest(f.k)
		if !ok {
			t.Fatal("no neediest")
		}
		wc.cancel()
		<-wc.res
		if closeLane {
			pc.Close()
		}
		if err := pa.UnregisterToward(ids[0], pc.Lane()); err != nil {
			t.Fatal(err)
		}
		served, _, plans := collect([]*winWaiter{wb}, 200*time.Millisecond)
		if len(served) != 1 || plans[0].Kind != PlanCreate {
			t.Fatalf("close %v: neediest lane %d; after UnregisterToward a lane whose waiter left, B's waiter served: %d", closeLane, lane, len(served))
		}
		plans[0].Permit.Close()
	}
}
