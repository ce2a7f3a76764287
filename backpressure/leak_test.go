package backpressure

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

//go:noinline
func dropPermit(t *testing.T, l *Limiter) {
	t.Helper()
	if _, err := l.TryAcquire(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// collectUntil runs the collector until cond holds, and reports whether it
// did before giving up.
func collectUntil(cond func() bool) bool {
	for range 200 {
		if cond() {
			return true
		}
		runtime.GC()
		time.Sleep(time.Millisecond)
	}
	return false
}

// Permits released in time, whole batches of them and alongside dropped
// ones, are never returned again by the collector, and each dropped permit
// is returned and counted exactly once: the count of permits held stays
// exact, so the cap is never exceeded.
func TestCollectorReturnsOnlyDroppedPermits(t *testing.T) {
	ctx := context.Background()
	l := New(WithCap(3))
	kept, err := l.Acquire(ctx) // held throughout: reachable, never returned
	if err != nil {
		t.Fatal(err)
	}
	const cycles = 10
	for c := range uint64(cycles) {
		var wg sync.WaitGroup
		for range 2 {
			wg.Go(func() {
				for range permitBatchSize {
					// Nothing waits, so a permit is always free unless
					// the count has gone wrong.
					if pm, err := l.TryAcquire(ctx); err != nil {
						t.Error(err)
						return
					} else {
						pm.Release()
						pm.Release()
					}
				}
			})
		}
		runtime.GC()
		wg.Wait()
		dropPermit(t, l)
		if !collectUntil(func() bool { return l.Leaked() == c+1 }) {
			t.Fatalf("cycle %d: Leaked %d, want %d", c, l.Leaked(), c+1)
		}
		if n := l.Active(); n != 1 {
			t.Fatalf("cycle %d: Active %d, want 1 (the permit kept)", c, n)
		}
	}
	a, errA := l.TryAcquire(ctx)
	b, errB := l.TryAcquire(ctx)
	if _, err := l.TryAcquire(ctx); errA != nil || errB != nil || !errors.Is(err, ErrSaturated) {
		t.Fatalf("cap 3 with one permit kept: TryAcquire gave %v, %v, then %v; want two permits, then ErrSaturated", errA, errB, err)
	}
	for _, pm := range []*Permit{a, b, kept} {
		pm.Release()
	}
	if n, leaked := l.Active(), l.Leaked(); n != 0 || leaked != cycles {
		t.Fatalf("after releasing everything: Active %d, Leaked %d; want 0, %d", n, leaked, cycles)
	}
}

// A dropped permit is reported to WithOnLeak's handler when the collector
// returns it, with the number returned; one released in time is not.
func TestDroppedPermitIsReported(t *testing.T) {
	var reported atomic.Int64
	l := New(WithCap(2), WithOnLeak(func(n int) { reported.Add(int64(n)) }))
	released, err := l.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	released.Release()
	dropPermit(t, l)
	if !collectUntil(func() bool { return reported.Load() >= 1 }) {
		t.Fatalf("a dropped permit was not reported (Leaked %d)", l.Leaked())
	}
	// Give the collector the chance to report more than it should.
	collectUntil(func() bool { return false })
	if n := reported.Load(); n != 1 || l.Leaked() != 1 || l.Active() != 0 {
		t.Fatalf("reported %d permits, Leaked %d, Active %d; want 1, 1 and 0", n, l.Leaked(), l.Active())
	}
}

// Release on a zero Permit, as on a nil one, does nothing.
func TestZeroPermitRelease(t *testing.T) {
	var pm Permit
	pm.Release()
}
