package orbitpool

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

// TestAdv2HeldGrantPassedByStaleUnclaimed: the held word makes a younger
// waiter of another process defer to an older one's delivered grant, unless
// the key counts unclaimed units. That count is never brought back down when
// the units it stands for are taken by a caller that did not defer (here a
// newcomer that found no waiter at all), so it outlives them, and the
// deferral it is the escape hatch of stops holding.
//
// The count is left behind by the most ordinary event there is: a resource
// of capacity 4 is registered while one waiter waits. Register announces 4+1
// units, one goes to the waiter, and the other 4 find nobody to hand them to
// and are counted unclaimed. The owner then fills the resource without
// waiting (nobody queues), which leaves the count at 4. From then on, a
// younger waiter of another process takes the unit handed to an older one,
// as TestDeliveredGrantIsNotTaken says it must not, four times over.
func TestAdv2HeldGrantPassedByStaleUnclaimed(t *testing.T) {
	ps := openShared(t, small, 3)
	a, b, c := ps[0], ps[1], ps[2]
	k := Key{0xad2e, 1}
	lim := Limits{MaxResources: 1}
	const capacity = 4

	// c holds the creation budget; a waits for it.
	plan, err := c.Acquire(context.Background(), k, LocalOnly{}, lim)
	if err != nil || plan.Kind != PlanCreate {
		t.Fatalf("first acquire: %v %v", plan.Kind, err)
	}
	first := make(chan fairResult, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		plan, err := a.Acquire(ctx, k, LocalFirst{}, lim)
		first <- fairResult{plan, err}
	}()
	waitFor(t, func() bool { return registeredWaiters(c, k) == 1 })
	id, err := plan.Permit.Register(capacity)
	if err != nil {
		t.Fatal(err)
	}
	var execs []*Execution
	defer func() {
		for _, e := range execs {
			e.Complete()
		}
	}()
	select {
	case r := <-first:
		if r.err != nil || r.plan.Kind != PlanReuseRemote {
			t.Fatalf("waiter: %v %v, want a lease on c's resource", r.plan.Kind, r.err)
		}
		e, err := c.Accept(r.plan.Lease)
		if err != nil {
			t.Fatal(err)
		}
		execs = append(execs, e)
	case <-time.After(5 * time.Second):
		t.Fatal("the waiter was not served by the resource registered for it")
	}
	waitFor(t, func() bool { return registeredWaiters(c, k) == 0 })
	// Nobody waits: c's own callers fill the resource without queueing.
	for range capacity - 1 {
		plan, err := c.Acquire(context.Background(), k, LocalOnly{}, lim)
		if err != nil || plan.Kind != PlanReuseLocal {
			t.Fatalf("filling: %v %v", plan.Kind, err)
		}
		execs = append(execs, plan.Execution)
	}
	ref, _ := c.lookupKey(k)
	unclaimed := atomic.LoadUint64(c.seg.u64(c.seg.keyOff(ref.idx) + kfUnclaimed))
	t.Logf("resource %v full (%d of %d in use), nobody waiting, key's unclaimed count %d", id, capacity, capacity, unclaimed)

	// Now the situation of TestDeliveredGrantIsNotTaken: an older waiter of
	// a is handed the unit that comes back, and a younger one of b arrives
	// before it takes it. Run it a few times: each round the older waiter
	// gives its unit back, so the resource is full again.
	for round := range 3 {
		r, err := a.Watch(k)
		if err != nil {
			t.Fatal(err)
		}
		e := execs[len(execs)-1]
		execs = execs[:len(execs)-1]
		e.Complete()
		select {
		case <-r.Ready():
		case <-time.After(5 * time.Second):
			t.Fatal("the unit given back was not handed to the waiter")
		}
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		plan, err := b.Acquire(ctx, k, LocalFirst{}, lim)
		cancel()
		if err == nil {
			u := atomic.LoadUint64(c.seg.u64(c.seg.keyOff(ref.idx) + kfUnclaimed))
			t.Errorf("round %d: a younger waiter of another process took the unit handed to an older one (%v); unclaimed count now %d", round, plan.Kind, u)
			if plan.Kind == PlanReuseRemote {
				if e, err := c.Accept(plan.Lease); err == nil {
					e.Complete()
				}
			}
		} else if we := (*WaitError)(nil); !errors.As(err, &we) {
			t.Fatalf("round %d: younger waiter: %v, want a WaitError", round, err)
		}
		// The older waiter takes its unit, and keeps it.
		l, err := a.Reserve(id)
		if err != nil {
			r.Close()
			t.Fatalf("round %d: the older waiter, handed the unit, finds none: %v", round, err)
		}
		ex, err := c.Accept(l)
		if err != nil {
			t.Fatal(err)
		}
		execs = append(execs, ex)
		r.Close()
		waitFor(t, func() bool { return registeredWaiters(c, k) == 0 })
	}
}
