package orbitpool

import (
	"context"
	"errors"
	"sync"
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

// siblingClaimsFirst decides as LocalFirst, but the first time it is asked
// it has a sibling claim the key's one creation unit, so that the create it
// then decides on loses the budget; the sibling's resource is registered
// after that loss, before the budget is read again.
type siblingClaimsFirst struct {
	sibling *Pool
	key     Key
	calls   int
	permit  *CreationPermit
	err     error
}

func (p *siblingClaimsFirst) Decide(v *View) Decision {
	if p.calls++; p.calls == 1 {
		p.permit, p.err = p.sibling.ClaimCreate(p.key, Limits{MaxCreating: 1})
	}
	return LocalFirst{}.Decide(v)
}

// TestCreationFinishedAfterALostClaimIsReused: under MaxCreating 1, a
// process whose claim lost the budget to a sibling's creation, which then
// finished before the budget was read again, reuses the sibling's resource.
// Deciding again on the candidates it had, which miss that resource, and
// on the budget read anew, which shows no creation under way, it used to
// create a second one: a burst of HTTP/2 requests to a cold upstream on a
// loaded machine opened two connections so.
func TestCreationFinishedAfterALostClaimIsReused(t *testing.T) {
	ps := openShared(t, PoolSpec{Lanes: 2, Keys: 8, ResourcesPerLane: 8}, 2)
	key := Key{0x57a1e, 2}
	policy := &siblingClaimsFirst{sibling: ps[1], key: key}
	var registerErr error
	var once sync.Once
	h := func() {
		once.Do(func() {
			registerErr = errors.New("the sibling's claim did not succeed")
			if policy.permit != nil {
				_, registerErr = policy.permit.Register(4)
			}
		})
	}
	testHookBudgetLost.Store(&h)
	t.Cleanup(func() { testHookBudgetLost.Store(nil) })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	plan, err := ps[0].Acquire(ctx, key, policy, Limits{MaxCreating: 1})
	if policy.err != nil {
		t.Fatalf("the sibling's claim: %v", policy.err)
	}
	if registerErr != nil {
		t.Fatalf("the hook did not run after a lost claim, or the sibling's registration failed: %v", registerErr)
	}
	if err != nil {
		t.Fatal(err)
	}
	if plan.Permit != nil {
		plan.Permit.Close()
	}
	if plan.Lease.ID != 0 {
		ps[0].Withdraw(plan.Lease)
	}
	if plan.Kind != PlanReuseRemote {
		t.Fatalf("plan %v after a sibling's creation finished between a lost claim and the next, want the sibling's resource reused", plan.Kind)
	}
	if live := ps[0].Live(key); live != 1 {
		t.Errorf("%d resources of the key live, want the sibling's one", live)
	}
}
