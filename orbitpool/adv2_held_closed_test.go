package orbitpool

import (
	"context"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// TestAdv2HeldReadinessClosedAfterPoolCloses: a Readiness that was handed a
// unit (its grant held) when its pool closed is closed by its user
// afterwards, as any deferred Close is. closeAll already passed its unit on,
// but leave passes it again (w.granted is still set, plus one for holding),
// from a pool whose lane another process now holds: grantLanes adds the
// grant to that lane's queue word as if it were its own lane's and calls the
// closed pool's deliver, which has nothing to deliver, and rings nobody. The
// new process's waiter now has an undelivered grant that its dispatcher was
// never told of, and every later return of capacity passes over its lane
// (laneNext: every waiting waiter has a grant on its way). A real unit that
// comes back goes to the key's unclaimed count, and the waiter sleeps with
// the budget free until its dispatcher wakes on its own (ReconcileInterval).
func TestAdv2HeldReadinessClosedAfterPoolCloses(t *testing.T) {
	spec := PoolSpec{Path: filepath.Join(t.TempDir(), "seg"), Lanes: 4, Keys: 8, ResourcesPerLane: 8}
	open := opener(t, spec, Options{ReconcileInterval: time.Hour, ReservationTimeout: time.Hour})
	a, b := open(), open()
	k := Key{0xad2e, 0xc105}
	lim := Limits{MaxResources: 1}
	r := handedTheUnit(t, a, b, k, lim)
	bLane := b.Lane()
	b.Close()
	c := open()
	if c.Lane() != bLane {
		t.Fatalf("the new process took lane %d, not the closed one's %d", c.Lane(), bLane)
	}
	// The budget is taken again, and c's waiter parks.
	plan, err := a.Acquire(context.Background(), k, LocalOnly{}, lim)
	if err != nil || plan.Kind != PlanCreate {
		t.Fatalf("second acquire: %v %v", plan.Kind, err)
	}
	res := make(chan fairResult, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		plan, err := c.Acquire(ctx, k, LocalOnly{}, lim)
		res <- fairResult{plan, err}
	}()
	waitFor(t, func() bool { return registeredWaiters(a, k) == 1 })
	r.Close() // the closed pool's user lets go of its Readiness
	ref, _ := a.lookupKey(k)
	q := atomic.LoadUint64(a.seg.u64(a.seg.queueOff(bLane, ref.idx)))
	t.Logf("lane %d's queue word after the closed pool's Readiness.Close: %d grants, %d waiting", bLane, qGrants(q), qWaiting(q))
	returned := time.Now()
	plan.Permit.Close() // a real unit comes back
	select {
	case r := <-res:
		if r.err != nil || r.plan.Kind != PlanCreate {
			t.Fatalf("c's waiter: %v %v, want a creation permit", r.plan.Kind, r.err)
		}
		r.plan.Permit.Close()
	case <-time.After(time.Second):
		u := atomic.LoadUint64(a.seg.u64(a.seg.keyOff(ref.idx) + kfUnclaimed))
		q := atomic.LoadUint64(a.seg.u64(a.seg.queueOff(bLane, ref.idx)))
		t.Fatalf("c's waiter not served %v after the only unit came back (key's unclaimed count %d; lane %d's queue word: %d grants undelivered, %d waiting)",
			time.Since(returned).Round(time.Millisecond), u, bLane, qGrants(q), qWaiting(q))
	}
}
