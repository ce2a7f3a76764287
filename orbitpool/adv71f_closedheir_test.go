package orbitpool

import (
	"context"
	"errors"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// TestAdv71fClosedHolderPassesToLaneHeir: a waiter (lane 129, the third mask
// word) takes the unit it was handed and is deciding when its pool closes; a
// new process takes the freed lane 129 and waits on the key, the fleet's only
// waiter. The closed waiter's unit goes on (leave's closed path) and its
// grant lands on lane 129, the closed pool's own lane number: grantLanes must
// ring the lane rather than "deliver" it through the closed pool's table, and
// the heir's waiter must be served.
func TestAdv71fClosedHolderPassesToLaneHeir(t *testing.T) {
	spec := PoolSpec{Path: filepath.Join(t.TempDir(), "seg"), Lanes: 130, Keys: 4, ResourcesPerLane: 2}
	opts := Options{ReconcileInterval: time.Hour, ReservationTimeout: time.Hour}
	open := opener(t, spec, opts)
	var ps []*Pool
	for range 130 {
		ps = append(ps, open())
	}
	b, a := ps[3], ps[129]
	k := Key{0xad71f, 30}
	lim := Limits{MaxResources: 1}
	pl, err := b.Acquire(context.Background(), k, LocalFirst{}, lim)
	if err != nil || pl.Kind != PlanCreate {
		t.Fatalf("b's creation: %v %v", pl.Kind, err)
	}
	eb, err := pl.Permit.RegisterAndAccept(1)
	if err != nil {
		t.Fatal(err)
	}
	ref, _ := b.lookupKey(k)
	s := b.seg
	waiting := func(l int) int { return qWaiting(atomic.LoadUint64(s.u64(s.queueOff(l, ref.idx)))) }
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for end := time.Now().Add(5 * time.Second); !cond(); time.Sleep(time.Millisecond) {
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
	waitFor("a's waiter", func() bool { return waiting(129) == 1 })
	gate.armed.Store(true)
	eb.Complete()
	select {
	case <-gate.in:
	case <-time.After(5 * time.Second):
		close(gate.out)
		t.Fatal("a's waiter never decided on its unit")
	}
	if err := a.Close(); err != nil {
		close(gate.out)
		t.Fatal(err)
	}
	d := open()
	if d.Lane() != 129 {
		close(gate.out)
		t.Fatalf("heir on lane %d", d.Lane())
	}
	// d's policy waits until told, so that it parks beside the room a's
	// waiter holds and only the unit a passes on can wake it.
	var dGo atomic.Bool
	dPol := adv71fWaitUntil{&dGo}
	dRes := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
		defer cancel()
		pl, err := d.Acquire(ctx, k, dPol, lim)
		if err == nil && pl.Kind == PlanReuseRemote {
			d.Withdraw(pl.Lease)
		} else if err == nil {
			err = errors.New("acquired " + pl.Kind.String())
		}
		dRes <- err
	}()
	for end := time.Now().Add(5 * time.Second); waiting(129) != 1; time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			close(gate.out)
			t.Fatal("the heir's waiter never parked")
		}
	}
	time.Sleep(50 * time.Millisecond) // its re-check after registering
	dGo.Store(true)
	close(gate.out)
	if err := <-aRes; !errors.Is(err, ErrClosed) {
		t.Fatalf("a's waiter, closed while deciding: %v", err)
	}
	if err := <-dRes; err != nil {
		t.Fatalf("the unit the closed waiter held never reached its lane's heir: %v", err)
	}
}

// adv71fWaitUntil waits until its flag is set, then is LocalFirst.
type adv71fWaitUntil struct{ go_ *atomic.Bool }

func (w adv71fWaitUntil) Decide(v *View) Decision {
	if !w.go_.Load() {
		return Decision{Action: ActionWait, Reason: ReasonBusy}
	}
	return LocalFirst{}.Decide(v)
}
