package orbitpool

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"
)

// BenchmarkKeyLookup is the cost of finding a key in a table of the default
// size (1024 keys) filled to 25, 50, 90 and 100%: a key that is there (hit),
// one that is not (miss), and the slowest key of the table to find (reported
// as worst-hit-ns, each key timed over the best of 5 rounds of 64 look-ups).
func BenchmarkKeyLookup(b *testing.B) {
	for _, fill := range []int{25, 50, 90, 100} {
		b.Run(fmt.Sprintf("fill=%d", fill), func(b *testing.B) {
			p := openMem(b, PoolSpec{Lanes: 4, Keys: DefaultKeyCapacity, ResourcesPerLane: 16})
			n := DefaultKeyCapacity * fill / 100
			keys := make([]Key, n)
			for i := range keys {
				keys[i] = benchKey(uint64(i))
				if _, err := p.internKey(keys[i]); err != nil {
					b.Fatal(err)
				}
			}
			b.Run("hit", func(b *testing.B) {
				i := 0
				for b.Loop() {
					if _, ok := p.lookupKey(keys[i%n]); !ok {
						b.Fatal("key not found")
					}
					i++
				}
				var worst time.Duration
				for _, k := range keys {
					best := time.Hour
					for range 5 { // the best of 5, so that preemption does not count
						t0 := time.Now()
						for range 64 {
							p.lookupKey(k)
						}
						best = min(best, time.Since(t0)/64)
					}
					worst = max(worst, best)
				}
				b.ReportMetric(float64(worst.Nanoseconds()), "worst-hit-ns")
			})
			b.Run("miss", func(b *testing.B) {
				i := uint64(0)
				for b.Loop() {
					if _, ok := p.lookupKey(benchKey(1<<40 + i%4096)); ok {
						b.Fatal("absent key found")
					}
					i++
				}
			})
		})
	}
}

// BenchmarkRemoteAcquire is Acquire with LocalFirst finding a sibling's free
// resource in a fleet of 64 lanes of 16 resources of one key, all in use but
// one on the last lane; then the owner accepts the lease and completes.
func BenchmarkRemoteAcquire(b *testing.B) {
	const lanes, per = 64, 16
	ps := openShared(b, PoolSpec{Lanes: lanes, Keys: 16, ResourcesPerLane: per}, lanes)
	k := Key{7, 7}
	var held []*Execution
	var last ResourceID
	for _, p := range ps {
		for range per {
			id, err := p.Register(k, 1)
			if err != nil {
				b.Fatal(err)
			}
			last = id
		}
	}
	for _, p := range ps {
		for range per {
			plan, err := p.Acquire(context.Background(), k, LocalOnly{}, Limits{})
			if err != nil || plan.Kind != PlanReuseLocal {
				b.Fatalf("%v %v", plan.Kind, err)
			}
			held = append(held, plan.Execution)
		}
	}
	for _, e := range held {
		if e.ID() == last {
			e.Complete()
		}
	}
	owner := ps[last.Lane()]
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		plan, err := ps[0].Acquire(ctx, k, LocalFirst{}, Limits{MaxResources: lanes * per})
		if err != nil || plan.Kind != PlanReuseRemote || plan.Lease.ID != last {
			b.Fatalf("%v %v %v", plan.Kind, plan.Lease.ID, err)
		}
		e, err := owner.Accept(plan.Lease)
		if err != nil {
			b.Fatal(err)
		}
		e.Complete()
	}
	runtime.KeepAlive(held) // a collected Execution would give its unit back
}
