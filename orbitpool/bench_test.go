package orbitpool

import (
	"context"
	"fmt"
	"sync"
	"testing"
)

func benchBackings(b *testing.B, f func(b *testing.B, p *Pool)) {
	spec := PoolSpec{Lanes: 4, Keys: 128, ResourcesPerLane: 1024}
	b.Run("memory", func(b *testing.B) { f(b, openMem(b, spec)) })
	b.Run("shared", func(b *testing.B) { f(b, openShared(b, spec, 1)[0]) })
}

// BenchmarkReserveAcceptComplete is one full remote-style cycle on one
// resource: reserve (one CAS), accept (ticket CAS + word CAS), complete.
func BenchmarkReserveAcceptComplete(b *testing.B) {
	benchBackings(b, func(b *testing.B, p *Pool) {
		id, err := p.Register(Key{1, 1}, 1)
		if err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		for b.Loop() {
			l, err := p.Reserve(id)
			if err != nil {
				b.Fatal(err)
			}
			e, err := p.Accept(l)
			if err != nil {
				b.Fatal(err)
			}
			e.Complete()
		}
	})
}

// BenchmarkReserveAcceptCompleteParallel is the same cycle from every P on
// one resource with room for all of them.
func BenchmarkReserveAcceptCompleteParallel(b *testing.B) {
	benchBackings(b, func(b *testing.B, p *Pool) {
		id, err := p.Register(Key{1, 1}, 64)
		if err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				l, err := p.Reserve(id)
				if err != nil {
					continue // all 8 pending bits taken by other Ps
				}
				e, err := p.Accept(l)
				if err != nil {
					b.Error(err)
					return
				}
				e.Complete()
			}
		})
	})
}

// BenchmarkAcquireLocalFirst is the request path's pool cost: Acquire with
// LocalFirst over 64 keys of 16 resources each, then Complete.
func BenchmarkAcquireLocalFirst(b *testing.B) {
	benchBackings(b, func(b *testing.B, p *Pool) {
		const nkeys, per = 64, 16
		keys := registerKeys(b, p, nkeys, per)
		ctx := context.Background()
		lim := Limits{MaxResources: per}
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			plan, err := p.Acquire(ctx, keys[i%nkeys], LocalFirst{}, lim)
			if err != nil || plan.Kind != PlanReuseLocal {
				b.Fatalf("%v %v", plan.Kind, err)
			}
			plan.Execution.Complete()
			i++
		}
	})
}

// BenchmarkAcquireLocalFirstParallel is Acquire from every P, so resources of
// a key are contended and some acquisitions take the second-best candidate.
func BenchmarkAcquireLocalFirstParallel(b *testing.B) {
	benchBackings(b, func(b *testing.B, p *Pool) {
		const nkeys, per = 64, 16
		keys := registerKeys(b, p, nkeys, per)
		lim := Limits{MaxResources: per}
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			ctx := context.Background()
			i := 0
			for pb.Next() {
				plan, err := p.Acquire(ctx, keys[i%nkeys], LocalFirst{}, lim)
				if err != nil {
					b.Error(err)
					return
				}
				plan.Execution.Complete()
				i++
			}
		})
	})
}

// benchKey is the i-th of a set of keys spread like the digests callers
// bring: every bit of both halves depends on i.
func benchKey(i uint64) Key {
	return Key{Hi: splitmix(2*i + 1), Lo: splitmix(2*i + 2)}
}

func splitmix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

// registerKeys registers per resources of capacity 1 under each of n keys.
func registerKeys(b *testing.B, p *Pool, n, per int) []Key {
	keys := make([]Key, n)
	for i := range keys {
		keys[i] = benchKey(uint64(i))
		for range per {
			if _, err := p.Register(keys[i], 1); err != nil {
				b.Fatal(err)
			}
		}
	}
	return keys
}

// BenchmarkWaitQueue is a capped key's hand-off with many goroutines of one
// process waiting: one resource, and waiters goroutines that each acquire it,
// release it, and queue again. An operation's cost should not grow with how
// many wait.
func BenchmarkWaitQueue(b *testing.B) {
	for _, waiters := range []int{4, 64, 1024} {
		b.Run(fmt.Sprintf("waiters=%d", waiters), func(b *testing.B) {
			p := openMem(b, PoolSpec{Lanes: 4, Keys: 128, ResourcesPerLane: 1024})
			k := Key{5, 5}
			if _, err := p.Register(k, 1); err != nil {
				b.Fatal(err)
			}
			lim := Limits{MaxResources: 1}
			ctx := context.Background()
			var (
				mu   sync.Mutex
				left = b.N
				wg   sync.WaitGroup
			)
			b.ReportAllocs()
			b.ResetTimer()
			for range waiters {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						mu.Lock()
						if left == 0 {
							mu.Unlock()
							return
						}
						left--
						mu.Unlock()
						plan, err := p.Acquire(ctx, k, LocalFirst{}, lim)
						if err != nil || plan.Kind != PlanReuseLocal {
							b.Errorf("%v %v", plan.Kind, err)
							return
						}
						plan.Execution.Complete()
					}
				}()
			}
			wg.Wait()
		})
	}
}
