package orbitpool

import (
	"context"
	"testing"
	"time"
)

// siblingCreatesFirst decides as LocalFirst, but the first time it is asked
// it has a sibling make a resource of the key, with room, before it
// answers: a creation that finishes between a process's look at the table
// and its claim.
type siblingCreatesFirst struct {
	sibling *Pool
	key     Key
	calls   int
	err     error
}

func (p *siblingCreatesFirst) Decide(v *View) Decision {
	if p.calls++; p.calls == 1 {
		cp, err := p.sibling.ClaimCreate(p.key, Limits{MaxCreating: 1})
		if err == nil {
			_, err = cp.Register(4)
		}
		p.err = err
	}
	return LocalFirst{}.Decide(v)
}

// TestCreationFinishedSinceTheViewIsReused: under MaxCreating 1, a process
// that decided to create on a view taken before a sibling's creation
// finished reuses the sibling's resource instead of making a second one
// (an HTTP/2 upstream got two connections for one burst this way).
func TestCreationFinishedSinceTheViewIsReused(t *testing.T) {
	ps := openShared(t, PoolSpec{Lanes: 2, Keys: 8, ResourcesPerLane: 8}, 2)
	key := Key{0x57a1e, 1}
	policy := &siblingCreatesFirst{sibling: ps[1], key: key}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	plan, err := ps[0].Acquire(ctx, key, policy, Limits{MaxCreating: 1})
	if policy.err != nil {
		t.Fatalf("the sibling's creation: %v", policy.err)
	}
	if err != nil {
		t.Fatal(err)
	}
	if plan.Permit != nil {
		plan.Permit.Close()
	}
	if plan.Kind != PlanReuseRemote {
		t.Fatalf("plan %v after a sibling's creation finished under the decision, want the sibling's resource reused", plan.Kind)
	}
	if policy.calls < 2 {
		t.Errorf("the policy was asked %d times; the stale view should have been looked at again", policy.calls)
	}
}
