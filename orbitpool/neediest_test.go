package orbitpool

import (
	"context"
	"testing"
	"time"
)

// towardCases are the order windows a unit given toward lane B is tested
// under, with the waiter it must reach.
var towardCases = []struct {
	name   string
	window uint32
	served int // index of the waiter Neediest names and the unit must go to: 0 is C's, 1 is B's
}{
	{"window", 4, 1},
	{"strict", 0, 0},
}

// TestUnregisterTowardTheNeediest: lane A holds three busy resources of a
// key at its cap of four, lane C one, lane B none; C's waiter arrived before
// B's. Neediest, asked by A, names B when B's waiter is within the order
// window of C's, and C in strict order. A resource A unregisters toward B
// gives its unit to B's waiter, passing C's older one, within the window;
// in strict order C's waiter gets it. A resource that is leaving (capacity
// 0) does not count as held. Counts raised by NeediestBy's adjust are
// compared as raised.
func TestUnregisterTowardTheNeediest(t *testing.T) {
	for _, tc := range towardCases {
		t.Run(tc.name, func(t *testing.T) {
			f := newWinFleet(t, 4, 3, func(int) uint32 { return tc.window })
			pa, pb, pc := f.ps[0], f.ps[1], f.ps[2]
			lim := Limits{MaxResources: 4}
			var ids []ResourceID
			for range 3 {
				id, err := pa.Register(f.k, 1)
				if err != nil {
					t.Fatal(err)
				}
				ids = append(ids, id)
			}
			if _, err := pc.Register(f.k, 1); err != nil {
				t.Fatal(err)
			}
			if _, _, _, ok := pa.Neediest(f.k); ok {
				t.Fatal("Neediest named a lane while no sibling waits")
			}
			// Each lane's own use makes its resources busy.
			useOwn(t, f, lim, pa, pa, pa, pc)
			ws := waitInCThenB(t, f, lim)

			wantLane, wantHeld := pb.Lane(), 0
			if tc.served == 0 {
				wantLane, wantHeld = pc.Lane(), 1
			}
			lane, held, own, ok := pa.Neediest(f.k)
			if !ok || lane != wantLane || held != wantHeld || own != 3 {
				t.Fatalf("Neediest = lane %d holding %d, own %d, ok %v; want lane %d holding %d, own 3", lane, held, own, ok, wantLane, wantHeld)
			}
			if tc.served == 1 {
				// Two resources A knows B is about to create, which the
				// table does not count yet, make C the neediest.
				creating := func(lane, held int) int {
					if lane == pb.Lane() {
						return held + 2
					}
					return held
				}
				if lane, held, _, ok := pa.NeediestBy(f.k, creating); !ok || lane != pc.Lane() || held != 1 {
					t.Errorf("NeediestBy with B's count raised by 2 = lane %d holding %d, ok %v; want C's lane %d holding 1", lane, held, ok, pc.Lane())
				}
			}
			if n := pa.LiveLanes(); n != 3 {
				t.Errorf("LiveLanes = %d with three pools in a segment of four lanes", n)
			}
			if err := pa.SetCapacity(ids[2], 0); err != nil {
				t.Fatal(err)
			}
			if _, _, own, _ := pa.Neediest(f.k); own != 2 {
				t.Errorf("with one resource at capacity 0, A holds %d, want 2", own)
			}

			if err := pa.UnregisterToward(ids[0], pb.Lane()); err != nil {
				t.Fatal(err)
			}
			servedToCreate(t, ws, tc.served, tc.window)
		})
	}
}

// TestCloseTowardTheNeediest: as TestUnregisterTowardTheNeediest, with
// the unit that of a creation permit lane A gives up instead of a resource
// it unregisters: A holds two busy resources and a permit, C one resource,
// B none, and the key is at its cap of four. The permit closed toward B
// gives its unit to B's waiter, passing C's older one, within the window;
// in strict order C's waiter gets it.
func TestCloseTowardTheNeediest(t *testing.T) {
	for _, tc := range towardCases {
		t.Run(tc.name, func(t *testing.T) {
			f := newWinFleet(t, 4, 3, func(int) uint32 { return tc.window })
			pa, pb, pc := f.ps[0], f.ps[1], f.ps[2]
			lim := Limits{MaxResources: 4}
			for _, p := range []*Pool{pa, pa, pc} {
				if _, err := p.Register(f.k, 1); err != nil {
					t.Fatal(err)
				}
			}
			cp, err := pa.ClaimCreate(f.k, lim)
			if err != nil {
				t.Fatal(err)
			}
			useOwn(t, f, lim, pa, pa, pc)
			ws := waitInCThenB(t, f, lim)
			if lane, held, own, ok := pa.Neediest(f.k); !ok || own != 2 || (tc.served == 1) != (lane == pb.Lane() && held == 0) {
				t.Fatalf("Neediest = lane %d holding %d, own %d, ok %v", lane, held, own, ok)
			}
			if err := cp.CloseToward(pb.Lane()); err != nil {
				t.Fatal(err)
			}
			servedToCreate(t, ws, tc.served, tc.window)
			if err := cp.CloseToward(pb.Lane()); err != nil {
				t.Errorf("a second close of the permit: %v, want none", err)
			}
		})
	}
}

// useOwn acquires, for each of ps, one of its own resources of f's key.
func useOwn(t *testing.T, f *winFleet, lim Limits, ps ...*Pool) {
	t.Helper()
	for _, p := range ps {
		if plan, err := p.Acquire(context.Background(), f.k, LocalOnly{}, lim); err != nil || plan.Kind != PlanReuseLocal {
			t.Fatalf("lane %d: acquire its own resource: %v %v", p.Lane(), plan.Kind, err)
		}
	}
}

// waitInCThenB queues a waiter in f's third pool (C) and then one in its
// second (B), both canceled when the test ends.
func waitInCThenB(t *testing.T, f *winFleet, lim Limits) []*winWaiter {
	ws := []*winWaiter{f.arrive(2, LocalFirst{}, lim), f.arrive(1, LocalFirst{}, lim)}
	t.Cleanup(func() {
		for _, w := range ws {
			w.cancel()
		}
	})
	return ws
}

// servedToCreate checks that one unit reached ws[want], and only it, as a
// permit to create, and closes that permit.
func servedToCreate(t *testing.T, ws []*winWaiter, want int, window uint32) {
	t.Helper()
	served, unserved, plans := collect(ws, 100*time.Millisecond)
	if len(served) != 1 || served[0] != ws[want] || plans[0].Kind != PlanCreate {
		t.Fatalf("window %d: the unit went to %d waiters (want only waiter %d, in lane %d, to create); %d still wait",
			window, len(served), want, ws[want].lane, len(unserved))
	}
	plans[0].Permit.Close()
}
