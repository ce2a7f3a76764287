package upstream

import (
	"slices"
	"sync"
	"testing"
	"time"
)

// TestHoldIsPrecise holds for a delay with a sub-millisecond part, which
// time.Sleep ends at least half a millisecond late on Linux: the runtime's
// poller waits in whole milliseconds. That would make the upstream slower
// than the figures computed from its delay. A loaded machine delays any
// wake-up, so the precision is judged by the best of a run of holds, taken
// one after another: concurrent goroutines' timers wake the poller for each
// other and hide time.Sleep's rounding.
func TestHoldIsPrecise(t *testing.T) {
	const d = 1500 * time.Microsecond
	holds := make([]time.Duration, 20)
	for i := range holds {
		start := time.Now()
		hold(d)
		holds[i] = time.Since(start)
	}
	if best := slices.Min(holds); best > d+400*time.Microsecond {
		t.Errorf("the best of %d holds took %v for a delay of %v: want at most 400µs more", len(holds), best, d)
	}
}

// TestHoldNeverEndsEarly holds concurrently, as the capped scenario's
// connections do: a hold shorter than its delay would let the upstream
// serve faster than its figures say.
func TestHoldNeverEndsEarly(t *testing.T) {
	const d = 1500 * time.Microsecond
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 10 {
				start := time.Now()
				hold(d)
				if took := time.Since(start); took < d {
					t.Errorf("a hold of %v ended after %v", d, took)
				}
			}
		})
	}
	wg.Wait()
}
