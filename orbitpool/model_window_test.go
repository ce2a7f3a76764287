package orbitpool

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestModelOrderWindow drives waiters in four lanes of one segment through
// random steps against a reference model of the order window: three
// resources of one use each, owned by three lanes, are all in use; a waiter
// arrives (and parks, or takes an idle resource), a use ends, a waiter's
// context is cancelled. Each step waits until the table is quiet, and then
// the model says exactly who must have been served: the room a use gives
// back goes to the oldest waiter of the owner's lane if that one is at most
// the window's tickets behind the fleet's oldest waiter, else to the fleet's
// oldest; it is a local use for a waiter of the owner's lane and a
// reservation for any other.
func TestModelOrderWindow(t *testing.T) {
	for _, window := range []uint32{0, 1, 3} {
		kept := 0
		for seed := range uint64(4) {
			t.Run(fmt.Sprintf("window=%d/seed=%d", window, seed), func(t *testing.T) { kept += modelOrderWindow(t, seed, window) })
		}
		if window > 0 && kept == 0 && !t.Failed() {
			t.Errorf("window %d: no unit was kept in its lane past an older waiter; the window went untested", window)
		}
	}
}

// windowUse is a use of the resource lane owner owns.
type windowUse struct {
	owner int
	e     *Execution
}

// modelOrderWindow returns how many units the window kept in their lane past
// an older waiter.
func modelOrderWindow(t *testing.T, seed uint64, window uint32) int {
	const lanes, owners, steps = 4, 3, 300
	spec := PoolSpec{Path: filepath.Join(t.TempDir(), "seg"), Lanes: lanes, Keys: 8, ResourcesPerLane: 4}
	opts := Options{ReconcileInterval: time.Hour, ReservationTimeout: time.Hour, OrderWindow: window}
	ps := make([]*Pool, lanes)
	for i := range ps {
		p, err := Open(spec, opts)
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		ps[i] = p
	}
	k := Key{0x6f77, seed}
	lim := Limits{MaxResources: owners}
	var (
		queue   []*fairWaiter // the model's waiters, oldest first
		used    []windowUse
		idle    []int // owners of resources with no use
		next    int
		tickets int
		kept    int
		trace   []string
	)
	defer func() {
		if t.Failed() {
			t.Logf("trace:\n%s", strings.Join(trace, "\n"))
		}
	}()
	for o := range owners {
		cp, err := ps[o].ClaimCreate(k, lim)
		if err != nil {
			t.Fatal(err)
		}
		e, err := cp.RegisterAndAccept(1)
		if err != nil {
			t.Fatal(err)
		}
		used = append(used, windowUse{o, e})
	}
	waiting := func() int { return registeredWaiters(ps[0], k) }
	// served expects w's acquisition to end with the resource of owner
	// (any idle one if owner < 0): a local use in its own lane, a
	// reservation its owner accepts in any other.
	served := func(step int, w *fairWaiter, owner int, why string) {
		select {
		case r := <-w.res:
			if r.err != nil {
				t.Fatalf("step %d (%s): waiter %d: %v", step, why, w.id, r.err)
			}
			if owner < 0 {
				switch r.plan.Kind {
				case PlanReuseLocal:
					owner = w.lane
				case PlanReuseRemote:
					owner = r.plan.Lease.ID.Lane()
				}
				i := 0
				for i < len(idle) && idle[i] != owner {
					i++
				}
				if i == len(idle) {
					t.Fatalf("step %d (%s): waiter %d (lane %d) got %v of lane %d; idle: %v", step, why, w.id, w.lane, r.plan.Kind, owner, idle)
				}
				removeAt(&idle, i)
			}
			switch {
			case w.lane == owner && r.plan.Kind == PlanReuseLocal:
				used = append(used, windowUse{owner, r.plan.Execution})
			case w.lane != owner && r.plan.Kind == PlanReuseRemote && r.plan.Lease.ID.Lane() == ps[owner].Lane():
				e, err := ps[owner].Accept(r.plan.Lease)
				if err != nil {
					t.Fatalf("step %d (%s): accepting waiter %d's lease: %v", step, why, w.id, err)
				}
				used = append(used, windowUse{owner, e})
			default:
				t.Fatalf("step %d (%s): waiter %d (lane %d) got %v (lease %+v), want the resource of lane %d", step, why, w.id, w.lane, r.plan.Kind, r.plan.Lease, owner)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("step %d (%s): waiter %d (lane %d) was not served; served instead: %v", step, why, w.id, w.lane, servedInstead(queue))
		}
	}
	// settle waits until the table shows the model's waiters, and checks
	// that none of them was served.
	settle := func(step int, why string) {
		deadline := time.Now().Add(5 * time.Second)
		for waiting() != len(queue) {
			if time.Now().After(deadline) {
				t.Fatalf("step %d (%s): %d waiters registered, model has %d", step, why, waiting(), len(queue))
			}
			time.Sleep(100 * time.Microsecond)
		}
		time.Sleep(2 * time.Millisecond)
		for _, x := range queue {
			if len(x.res) > 0 {
				r := <-x.res
				t.Fatalf("step %d (%s): waiter %d (lane %d) left the queue out of turn: %v %v", step, why, x.id, x.lane, r.plan.Kind, r.err)
			}
		}
		checkWaiterQueues(t, step, ps)
	}
	rng := rand.New(rand.NewPCG(seed, 7))
	for step := range steps {
		switch op := rng.IntN(10); {
		case op < 4 && len(queue) < 12: // arrive
			l := rng.IntN(lanes)
			w := startWaiter(ps[l], next, l, k, LocalFirst{}, lim)
			next++
			trace = append(trace, fmt.Sprintf("step %d: arrive %d lane %d", step, w.id, l))
			if len(idle) > 0 {
				// No waiter, since a use that ended found none: the
				// newcomer takes an idle resource, its own lane's if
				// it has one.
				owner := -1
				for _, o := range idle {
					if o == l {
						owner = o
					}
				}
				if owner >= 0 {
					removeAt(&idle, slices.Index(idle, owner))
				}
				served(step, w, owner, "arrival with an idle resource")
				w.cancel()
				continue
			}
			tickets++
			w.ticket = tickets
			queue = append(queue, w)
			settle(step, "arrival")
		case op < 8 && len(used) > 0: // a use ends
			u := removeAt(&used, rng.IntN(len(used)))
			trace = append(trace, fmt.Sprintf("step %d: use of lane %d's resource ends; queue %v", step, u.owner, windowQueue(queue)))
			u.e.Complete()
			if len(queue) == 0 {
				idle = append(idle, u.owner)
				continue
			}
			i := 0
			for j, x := range queue {
				if x.lane == u.owner {
					if x.ticket-queue[0].ticket <= int(window) {
						i = j
					}
					break
				}
			}
			if i > 0 {
				kept++
			}
			w := removeAt(&queue, i)
			served(step, w, u.owner, "use ended")
			w.cancel()
			settle(step, "use ended")
		case op < 10 && len(queue) > 0: // a waiter gives up
			w := removeAt(&queue, rng.IntN(len(queue)))
			trace = append(trace, fmt.Sprintf("step %d: cancel %d", step, w.id))
			w.cancel()
			select {
			case r := <-w.res:
				var we *WaitError
				if !errors.As(r.err, &we) {
					t.Fatalf("step %d: cancelled waiter %d: %v %v, want a WaitError", step, w.id, r.plan.Kind, r.err)
				}
			case <-time.After(5 * time.Second):
				t.Fatalf("step %d: cancelled waiter %d did not return", step, w.id)
			}
			settle(step, "cancel")
		}
	}
	for _, w := range queue {
		w.cancel()
		<-w.res
	}
	for _, u := range used {
		u.e.Complete()
	}
	return kept
}

func windowQueue(q []*fairWaiter) string {
	var b strings.Builder
	for _, w := range q {
		fmt.Fprintf(&b, " %d/l%d/t%d", w.id, w.lane, w.ticket)
	}
	return b.String()
}
