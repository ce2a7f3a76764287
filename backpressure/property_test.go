package backpressure

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// Random concurrent use with deadlines, cancellations, non-blocking acquires
// and double releases: the permits in use never exceed the cap, every
// refusal is one of the documented errors, and at the end no permit is held
// and no waiter queued. The bubble fails the test if any goroutine is left
// blocked at the end.
func TestRandomConcurrentUse(t *testing.T) {
	for seed := range uint64(4) {
		synctest.Test(t, func(t *testing.T) {
			const capacity = 3
			l := New(WithCap(capacity), WithNearWindow(time.Millisecond))
			var inUse, peak, granted atomic.Int64
			var wg sync.WaitGroup
			for id := range 16 {
				r := rand.New(rand.NewPCG(seed, uint64(id)))
				wg.Go(func() {
					for range 200 {
						c := l
						if r.IntN(2) == 0 {
							c = l.WithDeadline(time.Now().Add(time.Duration(r.IntN(5)) * time.Millisecond))
						}
						ctx, cancel := context.WithCancel(context.Background())
						if r.IntN(4) == 0 {
							ctx, cancel = context.WithTimeout(context.Background(), time.Duration(r.IntN(4))*time.Millisecond)
						}
						if r.IntN(8) == 0 {
							time.AfterFunc(time.Duration(r.IntN(3))*time.Millisecond, cancel)
						}
						var p *Permit
						var err error
						if r.IntN(3) == 0 {
							p, err = c.TryAcquire(ctx)
						} else {
							p, err = c.Acquire(ctx)
						}
						if err != nil {
							cancel()
							if _, ok := RefusalFor(err); !ok {
								t.Errorf("undocumented refusal %v", err)
							}
							if errors.Is(err, ErrQuotaExceeded) {
								t.Errorf("ErrQuotaExceeded from a pool with cap %d", capacity)
							}
							continue
						}
						granted.Add(1)
						n := inUse.Add(1)
						for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
						}
						if n > capacity {
							t.Errorf("%d permits in use, more than the cap %d", n, capacity)
						}
						time.Sleep(time.Duration(r.IntN(3)) * time.Millisecond)
						inUse.Add(-1)
						p.Release()
						if r.IntN(4) == 0 {
							p.Release()
						}
						cancel()
					}
				})
			}
			wg.Wait()
			checkNoLeak(t, l)
			if peak.Load() != capacity || granted.Load() == 0 {
				t.Errorf("peak in use %d, %d granted; the workload never filled the pool", peak.Load(), granted.Load())
			}
		})
	}
}
