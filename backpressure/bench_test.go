package backpressure

import (
	"context"
	"testing"

	"golang.org/x/sync/semaphore"
)

// The baseline for every benchmark here is golang.org/x/sync/semaphore doing
// the same job, measured in the same run; compare the pairs of sub-benchmarks.

var sink *Permit

// BenchmarkAcquireRelease is one goroutine taking and returning one permit.
func BenchmarkAcquireRelease(b *testing.B) {
	ctx := context.Background()
	b.Run("limiter", func(b *testing.B) {
		l := New()
		for b.Loop() {
			p, _ := l.Acquire(ctx)
			p.Release()
		}
	})
	// A permit that outlives the call (stored, or passed on) is heap-allocated.
	b.Run("limiter-escaping", func(b *testing.B) {
		l := New()
		for b.Loop() {
			sink, _ = l.Acquire(ctx)
			sink.Release()
		}
	})
	// A request context: cancellable, with a deadline, which costs a clock
	// read per acquire.
	b.Run("limiter-deadline", func(b *testing.B) {
		l := New()
		ctx, cancel := context.WithTimeout(ctx, 1<<40)
		defer cancel()
		for b.Loop() {
			p, _ := l.Acquire(ctx)
			p.Release()
		}
	})
	b.Run("semaphore", func(b *testing.B) {
		s := semaphore.NewWeighted(DefaultCap)
		for b.Loop() {
			_ = s.Acquire(ctx, 1)
			s.Release(1)
		}
	})
	// The semaphore has no deadline semantics, so it never reads the clock.
	b.Run("semaphore-deadline", func(b *testing.B) {
		s := semaphore.NewWeighted(DefaultCap)
		ctx, cancel := context.WithTimeout(ctx, 1<<40)
		defer cancel()
		for b.Loop() {
			_ = s.Acquire(ctx, 1)
			s.Release(1)
		}
	})
}

// BenchmarkTryAcquireRelease is the non-blocking pair.
func BenchmarkTryAcquireRelease(b *testing.B) {
	ctx := context.Background()
	b.Run("limiter", func(b *testing.B) {
		l := New()
		for b.Loop() {
			p, _ := l.TryAcquire(ctx)
			p.Release()
		}
	})
	b.Run("semaphore", func(b *testing.B) {
		s := semaphore.NewWeighted(DefaultCap)
		for b.Loop() {
			s.TryAcquire(1)
			s.Release(1)
		}
	})
}

// BenchmarkAcquireReleaseParallel is every core taking and returning a
// permit from a pool with room for all of them: the cost of contention on
// the shared word, without waiting.
func BenchmarkAcquireReleaseParallel(b *testing.B) {
	ctx := context.Background()
	b.Run("limiter", func(b *testing.B) {
		l := New()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				p, _ := l.Acquire(ctx)
				p.Release()
			}
		})
	})
	b.Run("semaphore", func(b *testing.B) {
		s := semaphore.NewWeighted(DefaultCap)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				_ = s.Acquire(ctx, 1)
				s.Release(1)
			}
		})
	})
}

// BenchmarkAcquireReleaseSaturated is every core contending for one permit,
// so that acquirers queue and are handed the permit in order.
func BenchmarkAcquireReleaseSaturated(b *testing.B) {
	ctx := context.Background()
	b.Run("limiter", func(b *testing.B) {
		l := New(WithCap(1))
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				p, _ := l.Acquire(ctx)
				p.Release()
			}
		})
	})
	b.Run("semaphore", func(b *testing.B) {
		s := semaphore.NewWeighted(1)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				_ = s.Acquire(ctx, 1)
				s.Release(1)
			}
		})
	})
}
