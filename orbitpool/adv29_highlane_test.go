package orbitpool

import (
	"context"
	"path/filepath"
	"testing"
	"time"
)

// TestAdv29HighLaneRoomAndGrant: with more than 64 lanes, a key's room and
// waiter masks take a word per 64 lanes. A resource with room in a lane of
// the second word is found by a sibling of the first (LocalFirst walks the
// room mask); a waiter in the second word is handed the unit a sibling of
// the first gives back; and the other way round.
func TestAdv29HighLaneRoomAndGrant(t *testing.T) {
	spec := PoolSpec{Path: filepath.Join(t.TempDir(), "seg"), Lanes: 256, Keys: 4, ResourcesPerLane: 2}
	var ps []*Pool
	for range 70 {
		p, err := Open(spec, Options{ReconcileInterval: time.Hour, ReservationTimeout: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		ps = append(ps, p)
	}
	for _, pair := range [][2]*Pool{{ps[len(ps)-1], ps[0]}, {ps[0], ps[len(ps)-1]}, {ps[66], ps[65]}} {
		own, other := pair[0], pair[1]
		k := Key{0xad29, uint64(own.Lane())<<8 | uint64(other.Lane())}
		lim := Limits{MaxResources: 1, MaxCreating: 1}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		plan, err := own.Acquire(ctx, k, LocalFirst{}, lim)
		if err != nil || plan.Kind != PlanCreate {
			t.Fatalf("lane %d: first acquire: %v %v", own.Lane(), plan.Kind, err)
		}
		exec, err := plan.Permit.RegisterAndAccept(1)
		if err != nil {
			t.Fatal(err)
		}
		// The other lane waits: the key is full.
		got := make(chan Plan, 1)
		go func() {
			pl, err := other.Acquire(ctx, k, LocalFirst{}, lim)
			if err != nil {
				t.Errorf("lane %d waiting for lane %d's unit: %v", other.Lane(), own.Lane(), err)
			}
			got <- pl
		}()
		time.Sleep(50 * time.Millisecond)
		exec.Complete()
		pl := <-got
		if pl.Kind != PlanReuseRemote || pl.Lease.ID != exec.ID() {
			t.Fatalf("lane %d waiting on lane %d's resource got %v", other.Lane(), own.Lane(), pl.Kind)
		}
		{
			other.Withdraw(pl.Lease)

		}
		// Now free: found at once.
		pl, err = other.Acquire(ctx, k, LocalFirst{}, lim)
		if err != nil || pl.Kind != PlanReuseRemote {
			t.Fatalf("lane %d finding lane %d's free resource: %v %v", other.Lane(), own.Lane(), pl.Kind, err)
		}
		other.Withdraw(pl.Lease)
		cancel()
	}
}
