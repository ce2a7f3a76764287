package orbitpool

import (
	"context"
	"testing"
	"time"
)

// TestAdvUnregisterTowardGoneLane: A holds both units of a key, as two
// resources or as a resource and a creation permit; B's waiter, then C's,
// wait. C leaves (its waiter gives up, then its pool closes) between
// Neediest and UnregisterToward (or the permit's CloseToward). The unit
// must reach B's waiter, not be lost. Then, with C's waiter granted but
// cancelled before it takes the unit, the unit must be passed on.
func TestAdvUnregisterTowardGoneLane(t *testing.T) {
	for _, permit := range []bool{false, true} {
		for _, closeLane := range []bool{true, false} {
			testTowardGoneLane(t, permit, closeLane)
		}
	}
}

func testTowardGoneLane(t *testing.T, permit, closeLane bool) {
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
		if permit {
			break
		}
	}
	var cp *CreationPermit
	if permit {
		var err error
		if cp, err = pa.ClaimCreate(f.k, lim); err != nil {
			t.Fatal(err)
		}
	}
	give := func(lane int) error {
		if permit {
			return cp.CloseToward(lane)
		}
		return pa.UnregisterToward(ids[0], lane)
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
	if err := give(pc.Lane()); err != nil {
		t.Fatal(err)
	}
	served, _, plans := collect([]*winWaiter{wb}, 200*time.Millisecond)
	if len(served) != 1 || plans[0].Kind != PlanCreate {
		t.Fatalf("permit %v, close %v: neediest lane %d; after giving the unit toward a lane whose waiter left, B's waiter served: %d", permit, closeLane, lane, len(served))
	}
	plans[0].Permit.Close()
}
