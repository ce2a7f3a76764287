package orbitpool

import (
	"context"
	"errors"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// TestAdv71dClosedReserverWakesLaneSuccessor: a Reserve that passed its
// closed check before its pool closed, and whose reservation then finds the
// resource over its lowered capacity, must give the reservation back. By
// then the pool's lane (the last of a 130-lane segment, in the third mask
// word) belongs to a new process with a waiter on the key. The closed pool
// once woke the key itself: its wake took that lane for its own
// (grantLanes: best == p.lane), added the grant to the new process's queue
// word, and "delivered" it through the closed pool's empty waiter table,
// ringing nobody; the new process's waiter then looked granted to every
// later return. Now the closed pool leaves the reservation to the owner,
// whose Reconcile drops it; when the resource's capacity is raised again,
// the waiter must be served, not left asleep until its dispatcher's next
// reconcile.
func TestAdv71dClosedReserverWakesLaneSuccessor(t *testing.T) {
	spec := PoolSpec{Path: filepath.Join(t.TempDir(), "seg"), Lanes: 130, Keys: 4, ResourcesPerLane: 2}
	opts := Options{ReconcileInterval: time.Hour, ReservationTimeout: time.Hour}
	open := opener(t, spec, opts)
	var ps []*Pool
	for range 130 {
		ps = append(ps, open())
	}
	a, b := ps[129], ps[64]
	k := Key{0xad71d, 7}
	lim := Limits{MaxResources: 1}
	r, err := b.Register(k, 1)
	if err != nil {
		t.Fatal(err)
	}
	ref, _ := b.lookupKey(k)
	s := b.seg
	aLane := a.Lane()

	var d *Pool
	dRes := make(chan error, 1)
	var armed atomic.Bool
	armed.Store(true)
	h := func(id ResourceID) {
		if id != r || !armed.CompareAndSwap(true, false) {
			return
		}
		// a closes while its Reserve is between the capacity read and
		// the reservation; the owner drains the resource; a new
		// process takes a's lane and waits on the key.
		if err := a.Close(); err != nil {
			t.Error(err)
		}
		if err := b.SetCapacity(r, 0); err != nil {
			t.Error(err)
		}
		d = open()
		if d.Lane() != aLane {
			t.Errorf("the new process took lane %d, not the closed one's %d", d.Lane(), aLane)
		}
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			pl, err := d.Acquire(ctx, k, LocalFirst{}, lim)
			if err == nil && pl.Kind == PlanReuseRemote {
				d.Withdraw(pl.Lease)
			} else if err == nil {
				err = errors.New("acquired " + pl.Kind.String())
			}
			dRes <- err
		}()
		for end := time.Now().Add(5 * time.Second); qWaiting(atomic.LoadUint64(s.u64(s.queueOff(aLane, ref.idx)))) != 1; time.Sleep(time.Millisecond) {
			if time.Now().After(end) {
				t.Error("the new process's waiter never registered")
				return
			}
		}
		time.Sleep(20 * time.Millisecond) // its re-check after registering
	}
	testHookGrant.Store(&h)
	defer testHookGrant.Store(nil)
	if _, err := a.Reserve(r); err == nil {
		t.Fatal("a's reservation, over the drained capacity, was granted")
	}
	testHookGrant.Store(nil)
	if t.Failed() {
		t.FailNow()
	}
	stuck := atomic.LoadUint64(s.u64(s.queueOff(aLane, ref.idx)))
	// A closed pool leaves its reservations to their owner (its late
	// withdrawal could act on a newer one once its lane is another's):
	// the owner's Reconcile drops the reservation of a lane life that
	// ended.
	if err := b.Reconcile(); err != nil {
		t.Fatal(err)
	}
	if n, _ := b.Users(r); n != 0 {
		t.Fatalf("the owner's Reconcile left the closed pool's reservation: %d users", n)
	}
	// Real room comes back: d's waiter is the only one.
	if err := b.SetCapacity(r, 1); err != nil {
		t.Fatal(err)
	}
	if err := <-dRes; err != nil {
		t.Fatalf("the new process's waiter on the closed pool's lane was never handed the room that came back (its queue word after the closed pool's wake: %#x, %d grants nobody rang for, %d waiting): %v", stuck, qGrants(stuck), qWaiting(stuck), err)
	}
}
