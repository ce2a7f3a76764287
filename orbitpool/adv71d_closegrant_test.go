package orbitpool

import (
	"context"
	"errors"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// adv71dGate is LocalFirst, except that once armed, the first decision that
// sees a candidate with room waits until the test lets it go: an embedder's
// policy is code of its own, and may take its time.
type adv71dGate struct {
	armed   *atomic.Bool
	in, out chan struct{}
}

func (g adv71dGate) Decide(v *View) Decision {
	for _, c := range v.Candidates {
		if c.Room() > 0 && g.armed.CompareAndSwap(true, false) {
			g.in <- struct{}{}
			<-g.out
			break
		}
	}
	return LocalFirst{}.Decide(v)
}

// TestAdv71dCloseWhileHoldingGrant: a waiter that has taken the unit it was
// handed (Acquire's take) and is still trying with it when its pool closes
// fails with ErrClosed. The unit it was handed is still there (a sibling's
// resource with room), and the next waiter of the fleet, in another
// process, must be handed it: the pool's Close must not swallow it (leave
// returns early once the table is closed, and closeAll passes on only the
// units of waiters still marked granted, not of one that took its unit).
//
// The closing pool's waiter decides under a policy that waits, once, while
// it sees the unit, so that the close lands between its take and its
// reservation; LocalFirst has the same window (its room walk), only narrower.
func TestAdv71dCloseWhileHoldingGrant(t *testing.T) {
	spec := PoolSpec{Path: filepath.Join(t.TempDir(), "seg"), Lanes: 130, Keys: 4, ResourcesPerLane: 4}
	opts := Options{ReconcileInterval: time.Hour, ReservationTimeout: time.Hour}
	open := opener(t, spec, opts)
	var ps []*Pool
	for range 130 {
		ps = append(ps, open())
	}
	// The owner, the closing waiter's lane and the next waiter's lane, in
	// three mask words.
	b, a, c := ps[3], ps[129], ps[70]
	for i, p := range ps {
		if p != a && p != b && p != c {
			p.Close()
			ps[i] = nil
		}
	}
	k := Key{0xad71d, 1}
	lim := Limits{MaxResources: 1}

	ctx0, cancel0 := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel0()
	pl, err := b.Acquire(ctx0, k, LocalFirst{}, lim)
	if err != nil || pl.Kind != PlanCreate {
		t.Fatalf("b's creation: %v %v", pl.Kind, err)
	}
	eb, err := pl.Permit.RegisterAndAccept(1)
	if err != nil {
		t.Fatal(err)
	}
	ref, ok := b.lookupKey(k)
	if !ok {
		t.Fatal("key not found")
	}
	s := b.seg
	waiting := func(p *Pool) int { return qWaiting(atomic.LoadUint64(s.u64(s.queueOff(p.Lane(), ref.idx)))) }
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for end := time.Now().Add(10 * time.Second); !cond(); time.Sleep(time.Millisecond) {
			if time.Now().After(end) {
				t.Fatalf("timed out waiting for %s", what)
			}
		}
	}

	gate := adv71dGate{armed: new(atomic.Bool), in: make(chan struct{}), out: make(chan struct{})}
	aRes := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		pl, err := a.Acquire(ctx, k, gate, lim)
		if err == nil {
			err = errors.New("acquired " + pl.Kind.String())
		}
		aRes <- err
	}()
	waitFor("a's waiter", func() bool { return waiting(a) == 1 })

	cRes := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		pl, err := c.Acquire(ctx, k, LocalFirst{}, lim)
		if err == nil && pl.Kind == PlanReuseRemote {
			c.Withdraw(pl.Lease)
		}
		cRes <- err
	}()
	waitFor("c's waiter", func() bool { return waiting(c) == 1 })

	// The unit goes to a's waiter, the oldest; it takes it and decides.
	gate.armed.Store(true)
	eb.Complete()
	select {
	case <-gate.in:
	case <-time.After(5 * time.Second):
		close(gate.out)
		t.Fatal("a's waiter never decided on the unit it was handed")
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	close(gate.out)
	if err := <-aRes; !errors.Is(err, ErrClosed) {
		t.Fatalf("a's waiter, closed while deciding: %v", err)
	}
	// b's resource has room and c's waiter is the only one left.
	if err := <-cRes; err != nil {
		t.Fatalf("the unit a's closed waiter held was never passed on to c's: %v", err)
	}
}
