package orbitpool

import (
	"context"
	"testing"
	"time"
)

// TestAdv67bCountWaitAfterKeyEntryReused: an Execution on a resource that was
// unregistered meanwhile (its Complete a no-op, as documented) must not add
// its wait to whatever key took its key entry since: the time belongs to a
// key that no longer has the entry, never to an unrelated upstream.
func TestAdv67bCountWaitAfterKeyEntryReused(t *testing.T) {
	backings(t, func(t *testing.T, p *Pool) {
		a := Key{0xa, 0xa}
		id, err := p.Register(a, 1)
		if err != nil {
			t.Fatal(err)
		}
		plan, err := p.Acquire(context.Background(), a, LocalFirst{}, Limits{MaxResources: 1})
		if err != nil || plan.Kind != PlanReuseLocal {
			t.Fatalf("acquire: %v %v", plan.Kind, err)
		}
		exec := plan.Execution
		if err := p.Unregister(id); err != nil {
			t.Fatal(err)
		}
		// Fill the rest of the key table so that a new key has to take
		// a's entry (collected: no resources, claims or waiters).
		var keys []Key
		for i := uint64(1); ; i++ {
			k := Key{0x100 + i, i}
			if _, err := p.Register(k, 1); err != nil {
				break
			}
			keys = append(keys, k)
			if len(keys) > 4*small.Keys {
				t.Fatal("key table never filled")
			}
		}
		// The table held a and 15 others; the 16th took a's entry
		// (collected: no resources, claims or waiters), the 17th failed.
		if len(keys) != small.Keys {
			t.Fatalf("%d keys registered beside a, want %d (a's entry reused)", len(keys), small.Keys)
		}
		exec.CountWait(time.Hour)
		exec.Complete()
		for _, k := range keys {
			if got := keyStats(t, p, k).WaitTime; got != 0 {
				t.Errorf("key %v has wait time %v from key a's Execution", k, got)
			}
		}
	})
}
