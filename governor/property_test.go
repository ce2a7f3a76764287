package governor

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// Random concurrent use, with nesting, cancellation and double releases: the
// workers held never exceed the worker count, every grant is at least one
// worker, and at the end nothing is held, charged or queued. The bubble fails
// the test if any goroutine is left blocked at the end.
func TestRandomConcurrentUse(t *testing.T) {
	for seed := range uint64(4) {
		synctest.Test(t, func(t *testing.T) {
			const workers, limit = 4, 4096
			g := New(workers, limit)
			var held, peak atomic.Int64 // workers charged, as the holders count them
			note := func(ls *LeaseSet, delta int64) {
				n := held.Add(delta * int64(ls.held))
				for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
				}
				if n > workers {
					t.Errorf("%d workers held, more than the %d the governor has", n, workers)
				}
			}

			var wg sync.WaitGroup
			for id := range 16 {
				r := rand.New(rand.NewPCG(seed, uint64(id)))
				wg.Go(func() {
					for range 200 {
						want, per := 1+r.IntN(6), uint64(r.IntN(3))*uint64(r.IntN(2048))
						var ls *LeaseSet
						switch r.IntN(4) {
						case 0:
							ls = g.AcquireMany(want, per)
						case 1:
							var ok bool
							if ls, ok = g.TryAcquireMany(want, per); !ok {
								continue
							}
						case 2, 3:
							ctx, cancel := context.WithTimeout(context.Background(), time.Duration(r.IntN(3))*time.Millisecond)
							var err error
							ls, err = g.AcquireManyContext(ctx, want, per)
							cancel()
							if err != nil {
								continue
							}
						}
						if ls.Workers() < 1 || ls.Workers() > want {
							t.Errorf("granted %d workers for want %d", ls.Workers(), want)
						}
						note(ls, 1)
						if r.IntN(3) == 0 { // nested helpers under the lease
							inner, err := g.AcquireManyContext(WithLease(context.Background(), ls), 1+r.IntN(4), per)
							if err != nil {
								t.Errorf("nested acquire: %v", err)
							} else {
								note(inner, 1)
								time.Sleep(time.Duration(r.IntN(2)) * time.Millisecond)
								note(inner, -1)
								inner.Release()
							}
						}
						time.Sleep(time.Duration(r.IntN(2)) * time.Millisecond)
						note(ls, -1)
						ls.Release()
						if r.IntN(4) == 0 {
							ls.Release()
						}
					}
				})
			}
			wg.Wait()
			checkIdle(t, g)
			if peak.Load() < 2 {
				t.Errorf("peak workers held = %d; the workload never ran in parallel", peak.Load())
			}
		})
	}
}
