package orbitpool

import (
	"errors"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// adv77aTicket reads the ticket word of bit b of id's slot.
func adv77aTicket(p *Pool, id ResourceID, b int) uint64 {
	s := p.seg
	return atomic.LoadUint64(s.u64(s.slotOff(id.Lane(), id.Slot()) + slTickets + 8*b))
}

// adv77aOpen opens a pool on spec and closes it when the test ends.
func adv77aOpen(t *testing.T, spec PoolSpec, opts Options) *Pool {
	t.Helper()
	p, err := Open(spec, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// adv77aReserved opens an owner and a reserver on a small table, registers
// key on the owner with capacity 1, and reserves it from the reserver.
func adv77aReserved(t *testing.T, key Key) (spec PoolSpec, owner, r *Pool, id ResourceID, l Lease) {
	t.Helper()
	spec = PoolSpec{Lanes: 2, Keys: 4, ResourcesPerLane: 2, Path: filepath.Join(t.TempDir(), "seg")}
	owner = adv77aOpen(t, spec, adv77aOpts)
	r = adv77aOpen(t, spec, adv77aOpts)
	id, err := owner.Register(key, 1)
	if err != nil {
		t.Fatal(err)
	}
	if l, err = r.Reserve(id); err != nil {
		t.Fatal(err)
	}
	return spec, owner, r, id, l
}

// adv77aOpts never ages a reservation during these tests (no Reconcile of
// the dispatcher claims a ticket, so the claim hook fires only in the
// operation under test) but reconciles often.
var adv77aOpts = Options{ReconcileInterval: 2 * time.Millisecond, ReservationTimeout: time.Minute}

// TestAdv77aAcceptHeldAcrossOwnerClose: the owner's Accept has claimed the
// lease's ticket and is held there while another goroutine of its process
// Closes the owner pool to the end; a new pool then takes the same lane,
// registers the key in the same slot, and the reserver reserves it. When
// the held Accept resumes it must refuse (ErrStale or ErrClosed) rather
// than hand out an Execution, and its unclaim must not clobber the new
// reservation's ticket. The old lease is then a no-op to Withdraw and
// Accept, the new one is accepted, no ticket or claim is left, and the
// key's budget counts only the new owner's resource.
func TestAdv77aAcceptHeldAcrossOwnerClose(t *testing.T) {
	key := Key{0xa77a, 1}
	spec, owner, r, id, l := adv77aReserved(t, key)
	var newOwner *Pool
	var newID ResourceID
	var l2 Lease
	holdNextClaim(t, func() {
		closed := make(chan error, 1)
		go func() { closed <- owner.Close() }()
		select {
		case err := <-closed:
			if err != nil {
				t.Errorf("owner Close: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("the owner's Close did not return within 5s while its Accept was held after its claim")
		}
		s := r.seg
		if w := atomic.LoadUint64(s.u64(s.slotOff(id.Lane(), id.Slot()) + slWord)); wState(w) == StateLive && wGen(w) == id.Generation() {
			t.Errorf("the closed owner's slot is still live in its generation: %#x", w)
		}
		newOwner = adv77aOpen(t, spec, adv77aOpts)
		if newOwner.lane != id.Lane() {
			t.Fatalf("the new pool took lane %d, want the closed owner's %d", newOwner.lane, id.Lane())
		}
		var err error
		if newID, err = newOwner.Register(key, 1); err != nil {
			t.Fatal(err)
		}
		if newID.Slot() != id.Slot() {
			t.Logf("new resource in slot %d, the old one was in %d", newID.Slot(), id.Slot())
		}
		if l2, err = r.Reserve(newID); err != nil {
			t.Fatalf("reserving the new owner's resource while the old Accept is held: %v", err)
		}
	})
	e, err := owner.Accept(l)
	if e != nil || err == nil {
		t.Fatalf("the held Accept of a closed pool returned %v, %v; want an error", e, err)
	}
	if !errors.Is(err, ErrStale) && !errors.Is(err, ErrClosed) {
		t.Errorf("the held Accept: %v, want ErrStale or ErrClosed", err)
	}
	if got := adv77aTicket(r, newID, int(l2.Bit)); got != l2.Ticket {
		t.Errorf("the new reservation's ticket is %#x after the old Accept ended, want %#x", got, l2.Ticket)
	}
	// The old lease is dead everywhere.
	r.Withdraw(l)
	if e, err := newOwner.Accept(l); err == nil {
		e.Complete()
		t.Errorf("the new owner accepted the closed owner's lease")
	}
	if n, err := newOwner.Users(newID); n != 1 || err != nil {
		t.Errorf("new resource: %d users (%v), want 1: the new reservation", n, err)
	}
	e2, err := newOwner.Accept(l2)
	if err != nil {
		t.Fatalf("Accept of the new lease: %v", err)
	}
	e2.Complete()
	idleAndServing(t, newOwner, r, newID)
	// The budget: only the new owner's resource counts.
	if cp, err := r.ClaimCreate(key, Limits{MaxResources: 1}); err == nil {
		cp.Close()
		t.Errorf("a creation within MaxResources 1 was granted while the new owner's resource lives")
	}
	if err := newOwner.Unregister(newID); err != nil {
		t.Fatal(err)
	}
	cp, err := r.ClaimCreate(key, Limits{MaxResources: 1})
	if err != nil {
		t.Fatalf("the key's budget is not whole after the closed owner's and the new owner's resources left: %v", err)
	}
	cp.Close()
}

// TestAdv77aAcceptLandsAfterCloseMarked: the owner's Accept is held after
// its claim while another goroutine Closes the pool; Close is let mark the
// pool closed but held before it releases the lane (the test holds the
// pool's reconcileMu, which Close takes next). The Accept then resumes and
// takes its use on the still-live slot. Its use lands after Close began, as
// a local use's would (useLocal refuses such a use with ErrClosed and gives
// it back): it must be refused the same way, not hand the caller an
// Execution whose slot Close frees a moment later.
func TestAdv77aAcceptLandsAfterCloseMarked(t *testing.T) {
	key := Key{0xa77a, 2}
	spec, owner, r, id, l := adv77aReserved(t, key)
	closed := make(chan error, 1)
	held := false
	holdNextClaim(t, func() {
		owner.reconcileMu.Lock()
		held = true
		go func() { closed <- owner.Close() }()
		deadline := time.Now().Add(5 * time.Second)
		for !owner.closed.Load() {
			if time.Now().After(deadline) {
				owner.reconcileMu.Unlock()
				t.Fatal("Close did not mark the pool closed within 5s")
			}
			time.Sleep(100 * time.Microsecond)
		}
	})
	e, aerr := owner.Accept(l)
	if !held {
		t.Fatalf("Accept never claimed the lease's ticket: %v, %v", e, aerr)
	}
	owner.reconcileMu.Unlock()
	select {
	case err := <-closed:
		if err != nil {
			t.Errorf("Close: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not return within 5s")
	}
	// Whatever Accept said, nothing of the old life may be left, and an
	// Execution of it must not touch the lane's next life.
	noTickets(t, r, id)
	next := adv77aOpen(t, spec, adv77aOpts)
	nid, err := next.Register(key, 2)
	if err != nil {
		t.Fatal(err)
	}
	if e != nil {
		e.Complete()
		e.Close()
	}
	if n, err := next.Users(nid); n != 0 || err != nil {
		t.Errorf("the lane's new resource has %d users (%v) after the old life's Execution completed, want 0", n, err)
	}
	idleAndServing(t, next, r, nid)
	if aerr == nil {
		t.Errorf("Accept took its use after Close had marked the pool closed and returned an Execution on slot %d, which Close then freed; want ErrClosed (as useLocal does)", id.Slot())
	} else if !errors.Is(aerr, ErrClosed) && !errors.Is(aerr, ErrStale) {
		t.Errorf("Accept: %v, want ErrClosed or ErrStale", aerr)
	}
}

// TestAdv77aExecutionAfterPoolClosed: an Execution accepted from a
// sibling's lease and a local one, both still held when their pool closes,
// are completed (twice) after the lane was taken by a new pool that
// registered the key in the same slots and holds uses on them: the old
// Executions must not give back the new life's uses, nor panic.
func TestAdv77aExecutionAfterPoolClosed(t *testing.T) {
	spec := PoolSpec{Lanes: 2, Keys: 4, ResourcesPerLane: 2, Path: filepath.Join(t.TempDir(), "seg")}
	key := Key{0xa77a, 3}
	owner, err := Open(spec, adv77aOpts)
	if err != nil {
		t.Fatal(err)
	}
	r := adv77aOpen(t, spec, adv77aOpts)
	id, err := owner.Register(key, 2)
	if err != nil {
		t.Fatal(err)
	}
	l, err := r.Reserve(id)
	if err != nil {
		t.Fatal(err)
	}
	eRemote, err := owner.Accept(l)
	if err != nil {
		t.Fatal(err)
	}
	eLocal := advAcquire(t, owner, key)
	if err := owner.Close(); err != nil {
		t.Fatal(err)
	}
	next := adv77aOpen(t, spec, adv77aOpts)
	if next.lane != owner.lane {
		t.Fatalf("the new pool took lane %d, want %d", next.lane, owner.lane)
	}
	nid, err := next.Register(key, 2)
	if err != nil {
		t.Fatal(err)
	}
	h1 := advAcquire(t, next, key)
	l2, err := r.Reserve(nid)
	if err != nil {
		t.Fatal(err)
	}
	h2, err := next.Accept(l2)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		eRemote.Complete()
		eLocal.Complete()
		eRemote.Close()
		eLocal.Close()
	}
	if n, err := next.Users(nid); n != 2 || err != nil {
		t.Errorf("the new life's resource has %d users (%v) after the closed pool's Executions completed, want 2", n, err)
	}
	// Accept, Reserve and Withdraw on the closed pool refuse or do nothing.
	if _, err := owner.Accept(l2); !errors.Is(err, ErrClosed) {
		t.Errorf("Accept on a closed pool: %v, want ErrClosed", err)
	}
	owner.Withdraw(l2)
	if n, _ := next.Users(nid); n != 2 {
		t.Errorf("a closed pool's Withdraw changed the new life's users to %d", n)
	}
	h1.Complete()
	h2.Complete()
	idleAndServing(t, next, r, nid)
}

// TestAdv77aWithdrawHeldAcrossOwnerClose: the reserver's Withdraw has
// claimed its lease's ticket on the owner's slot and is held there while
// the owner pool Closes, a new pool takes the lane and registers the key,
// and the reserver reserves the new resource. The held withdrawal must
// then clear neither the new reservation's bit nor its ticket: the new
// lease is accepted, and the resource is idle and serving after.
func TestAdv77aWithdrawHeldAcrossOwnerClose(t *testing.T) {
	key := Key{0xa77a, 4}
	spec, owner, r, id, l := adv77aReserved(t, key)
	var next *Pool
	var nid ResourceID
	var l2 Lease
	holdNextClaim(t, func() {
		if err := owner.Close(); err != nil {
			t.Errorf("owner Close: %v", err)
		}
		next = adv77aOpen(t, spec, adv77aOpts)
		if next.lane != id.Lane() {
			t.Fatalf("the new pool took lane %d, want %d", next.lane, id.Lane())
		}
		var err error
		if nid, err = next.Register(key, 1); err != nil {
			t.Fatal(err)
		}
		if l2, err = r.Reserve(nid); err != nil {
			t.Fatalf("reserving the new resource while the withdrawal is held: %v", err)
		}
	})
	start := time.Now()
	r.Withdraw(l) // the hook runs on this goroutine
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("the held Withdraw took %v", d)
	}
	if next == nil {
		t.Fatal("the withdrawal never claimed the lease's ticket")
	}
	if got := adv77aTicket(next, nid, int(l2.Bit)); got != l2.Ticket {
		t.Errorf("the new reservation's ticket is %#x after the old withdrawal, want %#x", got, l2.Ticket)
	}
	if n, err := next.Users(nid); n != 1 || err != nil {
		t.Errorf("after the old withdrawal: %d users (%v), want 1 (the new reservation)", n, err)
	}
	e, err := next.Accept(l2)
	if err != nil {
		t.Fatalf("Accept of the new lease: %v", err)
	}
	e.Complete()
	idleAndServing(t, next, r, nid)
}
