package orbitpool

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestModelTicketOrder drives waiters in four lanes of one segment through
// random steps against a reference model of a fleet-wide FIFO: a waiter
// arrives (and parks when the cap is reached), a held unit is given back,
// a waiter's context is cancelled, a lane is closed with units and waiters in
// it and another process joins in its place. Each step waits until the table
// is quiet, and then the model says exactly who must have been served: a unit
// that comes back goes to the oldest waiter of the fleet, a newcomer queues
// behind waiters, and a waiter that leaves takes nobody's turn. The units are
// creation budget, which goes in strict order whatever the order window.
func TestModelTicketOrder(t *testing.T) {
	for _, window := range []uint32{0, 2} {
		for seed := range uint64(4) {
			t.Run(fmt.Sprintf("window=%d/seed=%d", window, seed), func(t *testing.T) { modelTicketOrder(t, seed, window) })
		}
	}
}

// registeredWaiters is how many waiters the table shows on key k, over every
// lane: one process's view of the shared table is the fleet's.
func registeredWaiters(p *Pool, k Key) int {
	ref, ok := p.lookupKey(k)
	if !ok {
		return 0
	}
	n := 0
	for l := range p.l.nlanes {
		n += int(atomic.LoadUint32(p.seg.u32(p.seg.waitOff(l, ref.idx))))
	}
	return n
}

// removeAt removes and returns the i-th element of *s.
func removeAt[T any](s *[]T, i int) T {
	x := (*s)[i]
	*s = append((*s)[:i], (*s)[i+1:]...)
	return x
}

type fairWaiter struct {
	id     int
	lane   int
	ticket int // the model's, where it needs one
	cancel context.CancelFunc
	res    chan fairResult
}

// startWaiter starts an acquisition in p, of lane lane, as waiter id.
func startWaiter(p *Pool, id, lane int, k Key, pol Policy, lim Limits) *fairWaiter {
	ctx, cancel := context.WithCancel(context.Background())
	w := &fairWaiter{id: id, lane: lane, cancel: cancel, res: make(chan fairResult, 1)}
	go func() {
		plan, err := p.Acquire(ctx, k, pol, lim)
		w.res <- fairResult{plan, err}
	}()
	return w
}

// servedInstead names the waiters of queue whose acquisition ended.
func servedInstead(queue []*fairWaiter) []string {
	var others []string
	for _, x := range queue {
		if len(x.res) > 0 {
			others = append(others, fmt.Sprintf("%d (lane %d)", x.id, x.lane))
		}
	}
	return others
}

type fairResult struct {
	plan Plan
	err  error
}

type fairHeld struct {
	lane int
	cp   *CreationPermit
}

func modelTicketOrder(t *testing.T, seed uint64, window uint32) {
	const lanes, capacity, steps = 4, 3, 250
	spec := PoolSpec{Path: filepath.Join(t.TempDir(), "seg"), Lanes: lanes, Keys: 8, ResourcesPerLane: 16}
	opts := Options{ReconcileInterval: time.Hour, ReservationTimeout: time.Hour, OrderWindow: window}
	open := opener(t, spec, opts)
	ps := make([]*Pool, lanes)
	for i := range ps {
		ps[i] = open()
	}
	k := Key{0x6f72, seed}
	lim := Limits{MaxResources: capacity}
	rng := rand.New(rand.NewPCG(seed, 99))
	var (
		queue []*fairWaiter // the model's waiters, oldest first
		held  []fairHeld
		next  int
	)
	waiting := func() int { return registeredWaiters(ps[0], k) }
	quiet := func(step int, want int) {
		deadline := time.Now().Add(5 * time.Second)
		for waiting() != want {
			if time.Now().After(deadline) {
				t.Fatalf("step %d: %d waiters registered, model has %d", step, waiting(), want)
			}
			time.Sleep(100 * time.Microsecond)
		}
	}
	// served expects w's acquisition to end with a unit.
	served := func(step int, w *fairWaiter, why string) {
		select {
		case r := <-w.res:
			if r.err != nil || r.plan.Kind != PlanCreate {
				t.Fatalf("step %d (%s): waiter %d got %v %v, want a creation permit", step, why, w.id, r.plan.Kind, r.err)
			}
			held = append(held, fairHeld{w.lane, r.plan.Permit})
		case <-time.After(5 * time.Second):
			t.Fatalf("step %d (%s): the oldest waiter %d (lane %d) was not served; served instead: %v", step, why, w.id, w.lane, servedInstead(queue))
		}
	}
	// nobodyElse checks that no waiter still in the model was served.
	nobodyElse := func(step int, why string) {
		time.Sleep(2 * time.Millisecond)
		for _, x := range queue {
			if len(x.res) > 0 {
				r := <-x.res
				t.Fatalf("step %d (%s): waiter %d (lane %d) left the queue out of turn: %v %v", step, why, x.id, x.lane, r.plan.Kind, r.err)
			}
		}
	}
	var trace []string
	defer func() {
		if t.Failed() {
			t.Logf("trace:\n%s", strings.Join(trace, "\n"))
		}
	}()
	// settle waits until the table shows the model's waiters, and checks
	// that none of them was served.
	settle := func(step int, why string) {
		quiet(step, len(queue))
		nobodyElse(step, why)
		checkWaiterQueues(t, step, ps)
	}
	for step := range steps {
		ids := func() (s []int) {
			for _, w := range queue {
				s = append(s, w.id)
			}
			return s
		}
		trace = append(trace, fmt.Sprintf("step %d: queue %v held %d", step, ids(), len(held)))
		switch op := rng.IntN(10); {
		case op < 4 && len(queue) < 10: // arrive
			l := rng.IntN(lanes)
			w := startWaiter(ps[l], next, l, k, LocalOnly{}, lim)
			next++
			trace = append(trace, fmt.Sprintf("  arrive %d lane %d", w.id, l))
			if len(held) < capacity && len(queue) == 0 {
				served(step, w, "arrival with room")
				continue
			}
			queue = append(queue, w)
			settle(step, "arrival")
		case op < 7 && len(held) > 0: // give a unit back
			h := removeAt(&held, rng.IntN(len(held)))
			trace = append(trace, fmt.Sprintf("  give back lane %d", h.lane))
			if err := h.cp.Close(); err != nil {
				t.Fatal(err)
			}
			if len(queue) > 0 {
				w := queue[0]
				queue = queue[1:]
				served(step, w, "give back")
				w.cancel()
			}
			settle(step, "give back")
		case op < 9 && len(queue) > 0: // a waiter gives up
			w := removeAt(&queue, rng.IntN(len(queue)))
			trace = append(trace, fmt.Sprintf("  cancel %d", w.id))
			w.cancel()
			select {
			case r := <-w.res:
				if r.err == nil {
					held = append(held, fairHeld{w.lane, r.plan.Permit})
					t.Fatalf("step %d: cancelled waiter %d was served", step, w.id)
				}
				var we *WaitError
				if !errors.As(r.err, &we) {
					t.Fatalf("step %d: cancelled waiter %d: %v, want a WaitError", step, w.id, r.err)
				}
			case <-time.After(5 * time.Second):
				t.Fatalf("step %d: cancelled waiter %d did not return", step, w.id)
			}
			settle(step, "cancel")
		case op == 9: // a lane leaves with what it holds and waits for; another joins
			l := 1 + rng.IntN(lanes-1)
			var keep []fairHeld
			freed := 0
			for _, h := range held {
				if h.lane == l {
					freed++
				} else {
					keep = append(keep, h)
				}
			}
			held = keep
			var stay, gone []*fairWaiter
			for _, w := range queue {
				if w.lane == l {
					gone = append(gone, w)
				} else {
					stay = append(stay, w)
				}
			}
			queue = stay
			trace = append(trace, fmt.Sprintf("  close lane %d freeing %d", l, freed))
			if err := ps[l].Close(); err != nil {
				t.Fatal(err)
			}
			for _, w := range gone {
				if r := <-w.res; !errors.Is(r.err, ErrClosed) {
					t.Fatalf("step %d: waiter %d of the closed lane: %v %v, want ErrClosed", step, w.id, r.plan.Kind, r.err)
				}
			}
			// The units come back together, one for each the lane
			// held, and go to the oldest waiters, in whichever order
			// their processes take them.
			n := min(freed, len(queue))
			owed := make(map[*fairWaiter]bool, n)
			for _, w := range queue[:n] {
				owed[w] = true
			}
			deadline := time.Now().Add(5 * time.Second)
			for got := 0; got < n; {
				if time.Now().After(deadline) {
					t.Fatalf("step %d: %d of %d units handed out after lane %d closed", step, got, n, l)
				}
				for i := 0; i < len(queue); i++ {
					if w := queue[i]; len(w.res) > 0 {
						if !owed[w] {
							t.Fatalf("step %d: waiter %d, %d in the queue, was served with %d units back", step, w.id, i, freed)
						}
						served(step, w, "lane closed")
						w.cancel()
						queue = append(queue[:i], queue[i+1:]...)
						got++
						i--
					}
				}
				time.Sleep(100 * time.Microsecond)
			}
			ps[l] = open()
			settle(step, "close")
		}
	}
	for _, w := range queue {
		w.cancel()
		<-w.res
	}
	for _, h := range held {
		h.cp.Close()
	}
}

// A waiter delivered a grant owns the unit until it takes it: a younger
// waiter of another process that registers and re-checks meanwhile waits,
// though the unit is free and the older waiter's lane shows nobody waiting.
func TestDeliveredGrantIsNotTaken(t *testing.T) {
	ps := openShared(t, small, 2)
	adv2HeldDefers(t, ps[0], ps[1], Key{0x6472, 1})
}

// handedTheUnit has holder take key k's one unit of creation budget (lim),
// watcher watch k, and holder give the unit back: the Readiness it returns
// has been handed the unit and has not taken it.
func handedTheUnit(t *testing.T, holder, watcher *Pool, k Key, lim Limits) *Readiness {
	t.Helper()
	plan, err := holder.Acquire(context.Background(), k, LocalOnly{}, lim)
	if err != nil || plan.Kind != PlanCreate {
		t.Fatalf("first acquire: %v %v", plan.Kind, err)
	}
	r, err := watcher.Watch(k)
	if err != nil {
		t.Fatal(err)
	}
	plan.Permit.Close()
	select {
	case <-r.Ready():
	case <-time.After(5 * time.Second):
		t.Fatal("the unit given back was not handed to the watcher")
	}
	return r
}
