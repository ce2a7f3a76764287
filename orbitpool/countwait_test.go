package orbitpool

import (
	"context"
	"testing"
	"time"
)

// TestCountWait: an Execution adds the time its request waited outside
// Acquire to its own key's wait time, and nothing once it is complete, for
// a nonpositive time, or to another key.
func TestCountWait(t *testing.T) {
	p := openMem(t, small)
	k, other := Key{5, 5}, Key{6, 6}
	for _, key := range []Key{k, other} {
		if _, err := p.Register(key, 1); err != nil {
			t.Fatal(err)
		}
	}
	plan, err := p.Acquire(context.Background(), k, LocalFirst{}, Limits{MaxResources: 1})
	if err != nil || plan.Kind != PlanReuseLocal {
		t.Fatalf("acquire: %v %v", plan.Kind, err)
	}
	plan.Execution.CountWait(300 * time.Millisecond)
	plan.Execution.CountWait(0)
	plan.Execution.CountWait(-time.Second)
	plan.Execution.Complete()
	plan.Execution.CountWait(time.Hour) // complete: not counted
	if got := keyStats(t, p, k).WaitTime; got != 300*time.Millisecond {
		t.Errorf("key's wait time %v, want 300ms", got)
	}
	if got := keyStats(t, p, other).WaitTime; got != 0 {
		t.Errorf("another key's wait time %v, want 0", got)
	}
}
