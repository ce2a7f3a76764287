package fleet

import (
	"testing"
	"time"
)

// TestAdv18StaleCatchUpLeavesWorkerBehind: as above, but the catch-up of
// worker 1 to v2 times out too. Worker 1 then applies v2, v3 (late: v3 is
// the fleet's) and last the catch-up's v2. The supervisor must take that
// last answer for what worker 1 runs, though its configuration is older,
// and catch it up to v3: comparing generations, it recorded worker 1 at v3
// while it ran v2, and nothing loaded v3 into it again until the next
// reload or its restart.
func TestAdv18StaleCatchUpLeavesWorkerBehind(t *testing.T) {
	l, a := adv18TwoLateReloads(t)
	a[0].release(t)                                 // worker 0 applies v2 late: v2 is the fleet's
	a[1].wantArrival(t, "2")                        // catch-up of worker 1 to v2
	time.Sleep(adv18Timeout + 300*time.Millisecond) // it times out
	a[1].release(t)                                 // v2, late
	a[1].release(t)                                 // v3, late: v3 is the fleet's
	time.Sleep(100 * time.Millisecond)
	a[1].release(t) // the catch-up's v2, late
	adv18Settle(t, l, a, "3")
}
