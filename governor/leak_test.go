package governor

import (
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

//go:noinline
func dropLease(t *testing.T, g *Governor, per uint64) {
	t.Helper()
	if _, ok := g.TryAcquireMany(1, per); !ok {
		t.Fatal("no worker free to drop")
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

// Leases released in time, whole batches of them and alongside dropped
// ones, are never returned again by the collector, and each dropped lease is
// returned and counted exactly once: the workers and bytes charged stay
// exact, so the worker count is never exceeded.
func TestCollectorReturnsOnlyDroppedLeases(t *testing.T) {
	const per = 1000
	g := New(3, 0)
	kept := g.AcquireMany(1, per) // held throughout: reachable, never returned
	const cycles = 10
	for c := range uint64(cycles) {
		var wg sync.WaitGroup
		for range 2 {
			wg.Go(func() {
				for range leaseBatchSize {
					// Nothing waits, so a worker is always free unless
					// the count has gone wrong.
					ls, ok := g.TryAcquireMany(1, per)
					if !ok {
						t.Error("no worker free")
						return
					}
					ls.Release()
					ls.Release()
				}
			})
		}
		runtime.GC()
		wg.Wait()
		dropLease(t, g, per)
		if !collectUntil(func() bool { return g.Leaked() == c+1 }) {
			t.Fatalf("cycle %d: Leaked %d, want %d", c, g.Leaked(), c+1)
		}
		if o, r := g.Outstanding(), g.ReservedBytes(); o != 1 || r != per {
			t.Fatalf("cycle %d: %d workers, %d bytes charged; want 1, %d (the lease kept)", c, o, r, per)
		}
	}
	a, okA := g.TryAcquire()
	b, okB := g.TryAcquire()
	if _, ok := g.TryAcquire(); !okA || !okB || ok {
		t.Fatalf("3 workers with one kept: TryAcquire gave %v, %v, then %v; want two leases, then none", okA, okB, ok)
	}
	for _, ls := range []*LeaseSet{a, b, kept} {
		ls.Release()
	}
	if o, r, leaked := g.Outstanding(), g.ReservedBytes(), g.Leaked(); o != 0 || r != 0 || leaked != cycles {
		t.Fatalf("after releasing everything: %d workers, %d bytes charged, Leaked %d; want 0, 0, %d", o, r, leaked, cycles)
	}
}

// A dropped LeaseSet is reported to OnLeak's handler when the collector
// returns it, with the number returned; one released in time is not.
func TestDroppedLeaseIsReported(t *testing.T) {
	var reported atomic.Int64
	g := New(2, 0)
	g.OnLeak(func(n int) { reported.Add(int64(n)) })
	released, ok := g.TryAcquireMany(1, 0)
	if !ok {
		t.Fatal("no worker free")
	}
	released.Release()
	dropLease(t, g, 0)
	if !collectUntil(func() bool { return reported.Load() >= 1 }) {
		t.Fatalf("a dropped lease was not reported (Leaked %d)", g.Leaked())
	}
	// Give the collector the chance to report more than it should.
	collectUntil(func() bool { return false })
	if n := reported.Load(); n != 1 || g.Leaked() != 1 || g.Outstanding() != 0 {
		t.Fatalf("reported %d leases, Leaked %d, Outstanding %d; want 1, 1 and 0", n, g.Leaked(), g.Outstanding())
	}
}
