package orbitpool

import (
	"context"
	"runtime"
	"sync/atomic"
	"testing"
)

// TestCompleteHandsOffToLocalWaiter: when a use ends and its unit goes to a
// goroutine of this process that waits for it, that goroutine starts its use
// before the caller of Complete goes on. With one processor, the waiter holds
// its Execution by the time Complete returns; without the hand-off it would
// run only once the caller blocks.
func TestCompleteHandsOffToLocalWaiter(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	for _, shared := range []bool{false, true} {
		var p *Pool
		if shared {
			p = openShared(t, small, 1)[0]
		} else {
			p = openMem(t, small)
		}
		k := Key{3, 3}
		lim := Limits{MaxResources: 1}
		ctx := context.Background()
		if _, err := p.Register(k, 1); err != nil {
			t.Fatal(err)
		}
		const rounds = 50
		handed := 0
		for range rounds {
			plan, err := p.Acquire(ctx, k, LocalFirst{}, lim)
			if err != nil || plan.Kind != PlanReuseLocal {
				t.Fatalf("first use: %v %v", plan.Kind, err)
			}
			var got atomic.Bool
			next := make(chan Plan, 1)
			go func() {
				plan, err := p.Acquire(ctx, k, LocalFirst{}, lim)
				if err != nil {
					t.Error(err)
				}
				got.Store(true)
				next <- plan
			}()
			waitFor(t, func() bool { return keyStats(t, p, k).Waiting == 1 })
			plan.Execution.Complete()
			if got.Load() {
				handed++
			}
			plan = <-next
			if plan.Kind != PlanReuseLocal {
				t.Fatalf("waiter's plan %v, want reuse-local", plan.Kind)
			}
			plan.Execution.Complete()
		}
		// The runtime may preempt either goroutine at any time, which can
		// reorder them now and then on a loaded machine.
		if handed < rounds*8/10 {
			t.Errorf("shared=%v: the waiter had its use when Complete returned in %d of %d rounds", shared, handed, rounds)
		}
	}
}
