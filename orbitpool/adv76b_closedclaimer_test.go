package orbitpool

import (
	"errors"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// adv76bHoldClaim runs held once, in the next claim of any pool of this
// process, between the claim of a ticket and the use or release of its bit.
func adv76bHoldClaim(t *testing.T, held func()) {
	t.Helper()
	var once atomic.Bool
	h := func() {
		if once.CompareAndSwap(false, true) {
			held()
		}
	}
	testHookClaimed.Store(&h)
	t.Cleanup(func() { testHookClaimed.Store(nil) })
}

// TestAdv76bClosedClaimerSparesNextLease: a withdrawal is two steps: claim
// the lease's ticket, then clear its pending bit. The pool that withdraws
// is Closed by another goroutine of its (still running) process between
// the two steps. Close releases the lane, so the owner's Reconcile takes
// the claim for a dead process's, gives the unit back and frees the
// ticket; a new reservation then takes the same bit. The withdrawal's
// second step must not clear that new reservation: its lease must be
// accepted, and the resource must never admit more than its capacity.
func TestAdv76bClosedClaimerSparesNextLease(t *testing.T) {
	spec := PoolSpec{Lanes: 4, Keys: 2, ResourcesPerLane: 2, Path: filepath.Join(t.TempDir(), "seg")}
	const timeout = 50 * time.Millisecond
	open := opener(t, spec, Options{ReconcileInterval: time.Hour, ReservationTimeout: timeout})
	owner, r1, r2, r3 := open(), open(), open(), open()
	id, err := owner.Register(Key{0xa76b, 1}, 1)
	if err != nil {
		t.Fatal(err)
	}
	l1, err := r1.Reserve(id)
	if err != nil {
		t.Fatal(err)
	}
	var l2 Lease
	var got2 atomic.Bool
	adv76bHoldClaim(t, func() {
		// Another goroutine of r1's process closes it meanwhile.
		done := make(chan error, 1)
		go func() { done <- r1.Close() }()
		if err := <-done; err != nil {
			t.Errorf("Close: %v", err)
		}
		if err := owner.Reconcile(); err != nil {
			t.Errorf("Reconcile: %v", err)
		}
		var err error
		l2, err = r2.Reserve(id)
		if err != nil {
			t.Logf("no reservation after the closed claimer's was finished: %v", err)
			return
		}
		got2.Store(true)
		if l2.Bit != l1.Bit {
			t.Logf("the new reservation took bit %d, the withdrawn one had %d", l2.Bit, l1.Bit)
		}
	})
	r1.Withdraw(l1)
	if !got2.Load() {
		// Reconcile left the closed claimer's claim: nothing to spare.
		if n, _ := owner.Users(id); n != 0 {
			t.Errorf("after the withdrawal: %d users, want 0", n)
		}
		return
	}
	if n, _ := owner.Users(id); n != 1 {
		t.Errorf("with the new lease outstanding: %d users (reservations and uses), want 1", n)
	}
	if l3, err := r3.Reserve(id); err == nil {
		t.Errorf("a second reservation on a resource of capacity 1 with a lease outstanding was granted: %+v", l3)
		r3.Withdraw(l3)
	}
	e, err := owner.Accept(l2)
	if err != nil {
		t.Errorf("Accept of the lease granted after the closed claimer's claim was finished: %v "+
			"(the closed pool's late withdrawal step cleared the new reservation's bit %d)", err, l2.Bit)
	} else {
		e.Complete()
	}
	// Whatever happened, once every lease is over and aged, no ticket
	// may stay stamped on the slot (a stamped ticket over a clear bit
	// takes the bit out of use for as long as its reserver lives).
	time.Sleep(2 * timeout)
	for range 3 {
		if err := owner.Reconcile(); err != nil {
			t.Error(err)
		}
		time.Sleep(timeout)
	}
	adv76bNoTickets(t, owner, id)
}

// adv76bNoTickets fails t if a ticket or a claim is left on id's slot.
func adv76bNoTickets(t *testing.T, p *Pool, id ResourceID) {
	t.Helper()
	s := p.seg
	off := s.slotOff(id.Lane(), id.Slot())
	for b := range PendingReservations {
		if tk := atomic.LoadUint64(s.u64(off + slTickets + 8*b)); tk != 0 {
			t.Errorf("ticket %d of the slot is %#x after every reservation ended (claim: %v)", b, tk, isClaim(tk))
		}
	}
}

var _ = errors.Is
