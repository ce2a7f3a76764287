package governor

import (
	"context"
	"runtime"
	"testing"

	"golang.org/x/sync/semaphore"
)

// The baseline for every benchmark here is golang.org/x/sync/semaphore doing
// the same job, measured in the same run; compare the pairs of sub-benchmarks.

var sink *LeaseSet

// BenchmarkAcquireRelease is one goroutine taking and returning one worker.
func BenchmarkAcquireRelease(b *testing.B) {
	b.Run("governor", func(b *testing.B) {
		g := New(runtime.GOMAXPROCS(0), 0)
		for b.Loop() {
			g.Acquire().Release()
		}
	})
	// A lease that outlives the call (stored, or passed on) is heap-allocated.
	b.Run("governor-escaping", func(b *testing.B) {
		g := New(runtime.GOMAXPROCS(0), 0)
		for b.Loop() {
			sink = g.Acquire()
			sink.Release()
		}
	})
	b.Run("semaphore", func(b *testing.B) {
		s := semaphore.NewWeighted(int64(runtime.GOMAXPROCS(0)))
		ctx := context.Background()
		for b.Loop() {
			_ = s.Acquire(ctx, 1)
			s.Release(1)
		}
	})
}

// BenchmarkAcquireReleaseParallel is every core taking and returning one
// worker from a budget with room for all of them: the cost of contention on
// the shared word, without waiting.
func BenchmarkAcquireReleaseParallel(b *testing.B) {
	n := runtime.GOMAXPROCS(0)
	b.Run("governor", func(b *testing.B) {
		g := New(n, 0)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				g.Acquire().Release()
			}
		})
	})
	b.Run("semaphore", func(b *testing.B) {
		s := semaphore.NewWeighted(int64(n))
		ctx := context.Background()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				_ = s.Acquire(ctx, 1)
				s.Release(1)
			}
		})
	})
}

// BenchmarkAcquireReleaseSaturated is every core contending for a single
// worker, so that acquirers queue and are handed the worker in order.
func BenchmarkAcquireReleaseSaturated(b *testing.B) {
	b.Run("governor", func(b *testing.B) {
		g := New(1, 0)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				g.Acquire().Release()
			}
		})
	})
	b.Run("semaphore", func(b *testing.B) {
		s := semaphore.NewWeighted(1)
		ctx := context.Background()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				_ = s.Acquire(ctx, 1)
				s.Release(1)
			}
		})
	})
}

// BenchmarkAcquireManyBudgeted is a grant that charges memory, which takes
// the governor's lock; the semaphore is weighted by the bytes instead.
func BenchmarkAcquireManyBudgeted(b *testing.B) {
	b.Run("governor", func(b *testing.B) {
		g := New(8, 1<<30)
		for b.Loop() {
			g.AcquireMany(4, 64<<10).Release()
		}
	})
	b.Run("semaphore", func(b *testing.B) {
		s := semaphore.NewWeighted(1 << 30)
		ctx := context.Background()
		for b.Loop() {
			_ = s.Acquire(ctx, 4*64<<10)
			s.Release(4 * 64 << 10)
		}
	})
}
