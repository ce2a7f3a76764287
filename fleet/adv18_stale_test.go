package fleet

import (
	"testing"
	"time"
)

// TestAdv18StaleCatchUpLeavesWorkerBehind: as above, but the catch-up of
// worker 1 to v2 times out too. Worker 1 then applies v2, v3 (late: v3 is
// the fleet's) and last the catch-up's v2, whose late answer the supervisor
// ignores as "older than what the worker runs": worker 1 runs v2 while the
// supervisor records it at v3, and nothing loads v3 into it again until
// the next reload or its restart.
func TestAdv18StaleCatchUpLeavesWorkerBehind(t *testing.T) {
	const timeout = 500 * time.Millisecond
	l, a := newAdv18Loop(t, 2, timeout)
	l.start()

	adv18Reload(t, l, "2")
	a[0].wantArrival(t, "2")
	a[1].wantArrival(t, "2")
	time.Sleep(timeout + 300*time.Millisecond)
	adv18Reload(t, l, "3")
	a[0].wantArrival(t, "3")
	a[1].wantArrival(t, "3")
	time.Sleep(timeout + 300*time.Millisecond)

	a[0].release(t)                            // worker 0 applies v2 late: v2 is the fleet's
	a[1].wantArrival(t, "2")                   // catch-up of worker 1 to v2
	time.Sleep(timeout + 300*time.Millisecond) // it times out
	a[1].release(t)                            // v2, late
	a[1].release(t)                            // v3, late: v3 is the fleet's
	time.Sleep(100 * time.Millisecond)
	a[1].release(t) // the catch-up's v2, late
	adv18Settle(t, l, a, "3")
}
