package orbitpool

import (
	"errors"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// TestAdv76bClaimSpansSlotReuse: an Accept or a withdrawal held up between
// its claim and its bit step while the owner unregisters the resource and
// registers another (same key or another) in the same slot, on which a new
// reservation takes the same bit. The late step must not touch the new
// life: the Accept is refused, the withdrawal changes nothing, the new
// lease is accepted, and no ticket is left.
func TestAdv76bClaimSpansSlotReuse(t *testing.T) {
	for _, name := range []string{"withdraw-samekey", "withdraw-otherkey", "accept-samekey", "accept-otherkey"} {
		t.Run(name, func(t *testing.T) {
			spec := PoolSpec{Lanes: 4, Keys: 4, ResourcesPerLane: 1, Path: filepath.Join(t.TempDir(), "seg")}
			open := opener(t, spec, Options{ReconcileInterval: time.Hour, ReservationTimeout: time.Hour})
			owner, r1, r2 := open(), open(), open()
			id, err := owner.Register(Key{0xa76b, 20}, 1)
			if err != nil {
				t.Fatal(err)
			}
			l1, err := r1.Reserve(id)
			if err != nil {
				t.Fatal(err)
			}
			var id2 ResourceID
			var l2 Lease
			var ok2 bool
			holdNextClaim(t, func() {
				done := make(chan struct{})
				go func() { // another goroutine of the owner's process
					defer close(done)
					if err := owner.Unregister(id); err != nil {
						t.Errorf("Unregister: %v", err)
						return
					}
					k := Key{0xa76b, 20}
					if name[len(name)-8:] == "otherkey" {
						k = Key{0xa76b, 21}
					}
					var err error
					if id2, err = owner.Register(k, 1); err != nil {
						t.Errorf("Register: %v", err)
						return
					}
					if id2.Slot() != id.Slot() {
						t.Errorf("the new resource took slot %d, not %d", id2.Slot(), id.Slot())
					}
					if l2, err = r2.Reserve(id2); err != nil {
						t.Errorf("Reserve on the new life: %v", err)
						return
					}
					ok2 = true
				}()
				<-done
			})
			if name[:6] == "accept" {
				if e, err := owner.Accept(l1); err == nil {
					e.Complete()
					t.Errorf("Accept of a lease of the slot's previous life succeeded")
				} else if !errors.Is(err, ErrStale) {
					t.Errorf("Accept of a lease of the slot's previous life: %v, want ErrStale", err)
				}
			} else {
				r1.Withdraw(l1)
			}
			if !ok2 {
				t.FailNow()
			}
			if n, _ := owner.Users(id2); n != 1 {
				t.Errorf("new life: %d users with its lease outstanding, want 1", n)
			}
			e, err := owner.Accept(l2)
			if err != nil {
				t.Fatalf("Accept of the new life's lease: %v", err)
			}
			e.Complete()
			if n, _ := owner.Users(id2); n != 0 {
				t.Errorf("new life: %d users after its execution, want 0", n)
			}
			noTickets(t, owner, id2)
		})
	}
}

// TestAdv76bForgedLeases: leases with a claim mark as their ticket (the
// claim flag, or a claim mark held right now on the bit), with a ticket of
// the reserver's previous pool life, or replayed after Accept, are refused
// by Accept and ignored by Withdraw: the slot's word and tickets are
// unchanged and the real lease is still good.
func TestAdv76bForgedLeases(t *testing.T) {
	spec := PoolSpec{Lanes: 4, Keys: 2, ResourcesPerLane: 1, Path: filepath.Join(t.TempDir(), "seg")}
	open := opener(t, spec, Options{ReconcileInterval: time.Hour, ReservationTimeout: time.Hour})
	owner, r1 := open(), open()
	id, err := owner.Register(Key{0xa76b, 30}, 2)
	if err != nil {
		t.Fatal(err)
	}
	s := owner.seg
	off := s.slotOff(id.Lane(), id.Slot())
	snapshot := func() (w uint64, tk [PendingReservations]uint64) {
		w = atomic.LoadUint64(s.u64(off + slWord))
		for b := range PendingReservations {
			tk[b] = atomic.LoadUint64(s.u64(off + slTickets + 8*b))
		}
		return
	}
	// A reservation of a previous life of a reserver pool.
	old := open()
	lold, err := old.Reserve(id)
	if err != nil {
		t.Fatal(err)
	}
	old.Withdraw(lold)
	old.Close()
	l, err := r1.Reserve(id)
	if err != nil {
		t.Fatal(err)
	}
	w0, tk0 := snapshot()
	check := func(what string) {
		t.Helper()
		if w, tk := snapshot(); w != w0 || tk != tk0 {
			t.Errorf("%s changed the slot: word %#x -> %#x, tickets %x -> %x", what, w0, w, tk0, tk)
		}
	}
	forged := []struct {
		what string
		l    Lease
	}{
		{"claim flag on the real ticket", Lease{ID: l.ID, Owner: l.Owner, Bit: l.Bit, Ticket: l.Ticket | claimFlag}},
		{"claim flag alone", Lease{ID: l.ID, Owner: l.Owner, Bit: l.Bit, Ticket: claimFlag}},
		{"previous pool life's ticket", Lease{ID: l.ID, Owner: l.Owner, Bit: lold.Bit, Ticket: lold.Ticket}},
		{"other bit", Lease{ID: l.ID, Owner: l.Owner, Bit: l.Bit ^ 1, Ticket: l.Ticket}},
		{"zero ticket", Lease{ID: l.ID, Owner: l.Owner, Bit: l.Bit}},
	}
	for _, f := range forged {
		if e, err := owner.Accept(f.l); err == nil {
			e.Complete()
			t.Errorf("Accept of a forged lease (%s) succeeded", f.what)
		}
		check("Accept of " + f.what)
		r1.Withdraw(f.l)
		owner.Withdraw(f.l)
		check("Withdraw of " + f.what)
	}
	// A claim mark held on the bit right now, presented as a ticket.
	holdNextClaim(t, func() {
		mark := atomic.LoadUint64(s.u64(off + slTickets + 8*int(l.Bit)))
		if !isClaim(mark) {
			t.Errorf("ticket during the claim is %#x, not a claim", mark)
		}
		fl := Lease{ID: l.ID, Owner: l.Owner, Bit: l.Bit, Ticket: mark}
		if e, err := owner.Accept(fl); err == nil {
			e.Complete()
			t.Errorf("Accept of a lease naming the held claim succeeded")
		}
		r1.Withdraw(fl)
		if got := atomic.LoadUint64(s.u64(off + slTickets + 8*int(l.Bit))); got != mark {
			t.Errorf("a Withdraw naming the held claim changed it to %#x", got)
		}
		if w := atomic.LoadUint64(s.u64(off + slWord)); w&(1<<l.Bit) == 0 {
			t.Errorf("a Withdraw naming the held claim cleared the bit")
		}
	})
	e, err := owner.Accept(l)
	if err != nil {
		t.Fatalf("the real lease after the forgeries: %v", err)
	}
	// Replays after the Accept.
	if e2, err := owner.Accept(l); err == nil {
		e2.Complete()
		t.Errorf("a replayed lease was accepted again")
	}
	r1.Withdraw(l)
	if n, _ := owner.Users(id); n != 1 {
		t.Errorf("after a replayed Withdraw of an accepted lease: %d users, want 1", n)
	}
	e.Complete()
	noTickets(t, owner, id)
}

// TestAdv76bTicketWrap: the ticket counter of a pool wraps. A ticket is
// never zero and never carries the claim flag, and a reservation and the
// claims around the wrap work: Accept and Withdraw across it leave nothing.
func TestAdv76bTicketWrap(t *testing.T) {
	spec := PoolSpec{Lanes: 4, Keys: 2, ResourcesPerLane: 1, Path: filepath.Join(t.TempDir(), "seg")}
	open := opener(t, spec, Options{ReconcileInterval: time.Hour, ReservationTimeout: time.Hour})
	owner, r1 := open(), open()
	id, err := owner.Register(Key{0xa76b, 40}, 3)
	if err != nil {
		t.Fatal(err)
	}
	for _, start := range []uint32{0x7ffffffd, 0xfffffffd, 0xfffffffe, 0xffffffff, 0x7fffffff} {
		r1.tickets.Store(start)
		owner.tickets.Store(start)
		for range 4 {
			tk := r1.newTicket()
			if uint32(tk) == 0 || isClaim(tk) {
				t.Errorf("after counter %#x: ticket %#x (zero counter or claim flag)", start, tk)
			}
		}
		r1.tickets.Store(start)
		var ls []Lease
		for range 3 {
			l, err := r1.Reserve(id)
			if err != nil {
				t.Fatalf("Reserve near counter %#x: %v", start, err)
			}
			ls = append(ls, l)
		}
		for i := range ls {
			for j := range i {
				if ls[i].Ticket == ls[j].Ticket {
					t.Errorf("two live reservations carry ticket %#x", ls[i].Ticket)
				}
			}
		}
		r1.Withdraw(ls[0])
		e, err := owner.Accept(ls[1])
		if err != nil {
			t.Fatalf("Accept near counter %#x: %v", start, err)
		}
		e.Complete()
		r1.Withdraw(ls[2])
		if n, _ := owner.Users(id); n != 0 {
			t.Errorf("near counter %#x: %d users after all leases ended", start, n)
		}
		noTickets(t, owner, id)
	}
}

// TestAdv76bClaimerGoneAfterBitStep: a withdrawer whose life ends after it
// cleared its bit and before it freed the ticket of its claim (simulated:
// its two steps run by hand, then its pool closes) leaves a claim over a
// clear bit. The owner's Reconcile must free the ticket without giving the
// unit back a second time: the resource serves exactly its capacity.
func TestAdv76bClaimerGoneAfterBitStep(t *testing.T) {
	spec := PoolSpec{Lanes: 4, Keys: 2, ResourcesPerLane: 1, Path: filepath.Join(t.TempDir(), "seg")}
	open := opener(t, spec, Options{ReconcileInterval: time.Hour, ReservationTimeout: time.Hour})
	owner, r1, r2 := open(), open(), open()
	const capacity = 2
	id, err := owner.Register(Key{0xa76b, 60}, capacity)
	if err != nil {
		t.Fatal(err)
	}
	l, err := r1.Reserve(id)
	if err != nil {
		t.Fatal(err)
	}
	s := owner.seg
	off := s.slotOff(id.Lane(), id.Slot())
	mark, ok := r1.claim(off, int(l.Bit), l.Ticket)
	if !ok {
		t.Fatal("claim failed")
	}
	if !r1.dropReservation(off, id.Generation(), 1<<l.Bit) {
		t.Fatal("bit step failed")
	}
	r1.Close()
	if err := owner.Reconcile(); err != nil {
		t.Fatal(err)
	}
	if tk := atomic.LoadUint64(s.u64(off + slTickets + 8*int(l.Bit))); tk != 0 {
		t.Errorf("ticket %#x left after Reconcile (the dead claim was %#x)", tk, mark)
	}
	if n, _ := owner.Users(id); n != 0 {
		t.Errorf("%d users after the dead claimer's withdrawal, want 0", n)
	}
	var ls []Lease
	for range capacity + 1 {
		l, err := r2.Reserve(id)
		if err != nil {
			break
		}
		ls = append(ls, l)
	}
	if len(ls) != capacity {
		t.Errorf("%d reservations granted, capacity %d", len(ls), capacity)
	}
	for _, l := range ls {
		e, err := owner.Accept(l)
		if err != nil {
			t.Errorf("Accept: %v", err)
			continue
		}
		e.Complete()
	}
	noTickets(t, owner, id)
}
