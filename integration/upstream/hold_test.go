package upstream

import (
	"slices"
	"sync"
	"testing"
	"time"
)

// TestHoldIsPrecise holds concurrently, as the capped scenario's connections
// do, for a delay with a sub-millisecond part: time.Sleep ends such a delay
// at least 0.6ms late on Linux, which would make the upstream slower than
// the figures computed from its delay.
func TestHoldIsPrecise(t *testing.T) {
	const d = 1500 * time.Microsecond
	var (
		mu    sync.Mutex
		holds []time.Duration
		wg    sync.WaitGroup
	)
	for range 8 {
		wg.Go(func() {
			for range 10 {
				start := time.Now()
				hold(d)
				took := time.Since(start)
				mu.Lock()
				holds = append(holds, took)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	slices.Sort(holds)
	if holds[0] < d {
		t.Errorf("a hold of %v ended after %v", d, holds[0])
	}
	if median := holds[len(holds)/2]; median > d+400*time.Microsecond {
		t.Errorf("median hold %v for a delay of %v: want at most 400µs more", median, d)
	}
}
