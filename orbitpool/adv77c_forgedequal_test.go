package orbitpool

import (
	"errors"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// TestAdv77cForgedCopyOfLiveClaim: a corrupt word copies the mark of the
// owner's live, held Accept onto another pending bit of the same slot
// (set), or a forged mark is written there that the owner's very next
// claim will then take as its own. While the real claim is held,
// Reconcile (1ms timeout, run for 30 timeouts) must not touch the real
// claim's reservation: the held Accept returns an Execution. Once the real
// claim is over the copy is a stray claim, and Reconcile gives its unit
// back. No unit is lost or doubled, no ticket or claim is left.
func TestAdv77cForgedCopyOfLiveClaim(t *testing.T) {
	for _, how := range []string{"copy", "future"} {
		t.Run(how, func(t *testing.T) {
			spec := PoolSpec{Lanes: 2, Keys: 2, ResourcesPerLane: 2, Path: filepath.Join(t.TempDir(), "seg")}
			const timeout = time.Millisecond
			opts := Options{ReconcileInterval: time.Hour, ReservationTimeout: timeout}
			owner := adv77aOpen(t, spec, opts)
			r := adv77aOpen(t, spec, opts)
			id, err := owner.Register(Key{0xa77c, 2}, 2)
			if err != nil {
				t.Fatal(err)
			}
			s := owner.seg
			off := s.slotOff(id.Lane(), id.Slot())
			l, err := r.Reserve(id)
			if err != nil {
				t.Fatal(err)
			}
			other := (int(l.Bit) + 3) % PendingReservations
			forge := func(mark uint64) {
				atomic.StoreUint64(s.u64(off+slTickets+8*other), mark)
				atomic.OrUint64(s.u64(off+slWord), 1<<other)
			}
			var future uint64
			if how == "future" {
				future = makeTicket(owner.lane, owner.laneGen, owner.tickets.Load()+1) | claimFlag
				forge(future)
				// Reconcile sees it first as a stray, and starts its clock.
				if err := owner.Reconcile(); err != nil {
					t.Fatal(err)
				}
			}
			var realMark uint64
			var heldUsers int
			holdNextClaim(t, func() {
				realMark = adv77aTicket(owner, id, int(l.Bit))
				if how == "copy" {
					forge(realMark)
				} else if realMark != future {
					t.Errorf("setup: the Accept's claim is %#x, the forged mark %#x", realMark, future)
				}
				for range 30 {
					if err := owner.Reconcile(); err != nil {
						t.Errorf("Reconcile: %v", err)
					}
					time.Sleep(timeout)
				}
				heldUsers, _ = owner.Users(id)
				if got := adv77aTicket(owner, id, int(l.Bit)); got != realMark {
					t.Errorf("the held Accept's claim %#x was replaced by %#x", realMark, got)
				}
			})
			e, err := owner.Accept(l)
			if err != nil {
				t.Fatalf("the Accept held with a forged copy of its claim elsewhere: %v", err)
			}
			if heldUsers != 2 {
				t.Errorf("while the real claim was held: %d users and reservations, want 2 (it and the copy)", heldUsers)
			}
			// The copy is a stray now: gone within a few timeouts.
			deadline := time.Now().Add(5 * time.Second)
			for {
				if err := owner.Reconcile(); err != nil {
					t.Fatal(err)
				}
				if n, _ := owner.Users(id); n == 1 {
					break
				}
				if time.Now().After(deadline) {
					n, _ := owner.Users(id)
					t.Fatalf("the stray copy of an ended claim still holds a unit after 5s: %d users", n)
				}
				time.Sleep(timeout)
			}
			if _, err := r.Reserve(id); err != nil {
				// One unit is the Execution's, the other free again.
				t.Errorf("the copy's unit did not come back: %v", err)
			}
			e.Complete()
			// The extra reservation made above ages out or is accepted:
			// settle it so the resource is idle.
			for range 20 {
				owner.Reconcile()
				time.Sleep(timeout)
			}
			adv77cClaimsForgotten(t, owner)
			testHookClaimed.Store(nil)
			adv77cWhole(t, owner, r, []ResourceID{id}, 2)
		})
	}
}

// TestAdv77cOwnWithdrawalHeld: the owner reserves its own resource and
// withdraws the lease, held between the claim and the bit's release for
// 30 reservation timeouts while Reconcile runs: the claim names the
// owner's own lane and life, and is under way, so Reconcile must leave the
// bit (a new reservation finds no room) and the withdrawal then clears it.
func TestAdv77cOwnWithdrawalHeld(t *testing.T) {
	spec := PoolSpec{Lanes: 2, Keys: 2, ResourcesPerLane: 2, Path: filepath.Join(t.TempDir(), "seg")}
	const timeout = time.Millisecond
	opts := Options{ReconcileInterval: time.Hour, ReservationTimeout: timeout}
	owner := adv77aOpen(t, spec, opts)
	r := adv77aOpen(t, spec, opts)
	id, err := owner.Register(Key{0xa77c, 3}, 1)
	if err != nil {
		t.Fatal(err)
	}
	l, err := owner.Reserve(id)
	if err != nil {
		t.Fatalf("the owner's reservation of its own resource: %v", err)
	}
	var during int
	var stolen error = errors.New("not tried")
	holdNextClaim(t, func() {
		for range 30 {
			if err := owner.Reconcile(); err != nil {
				t.Errorf("Reconcile: %v", err)
			}
			time.Sleep(timeout)
		}
		during, _ = owner.Users(id)
		var l2 Lease
		l2, stolen = r.Reserve(id)
		if stolen == nil {
			r.Withdraw(l2)
		}
	})
	owner.Withdraw(l)
	if during != 1 {
		t.Errorf("Reconcile dropped the bit of the owner's own withdrawal under way: %d users, want 1", during)
	}
	if !errors.Is(stolen, ErrBusy) {
		t.Errorf("a new reservation while the owner's own withdrawal held its claim: %v, want ErrBusy", stolen)
	}
	adv77cClaimsForgotten(t, owner)
	testHookClaimed.Store(nil)
	adv77cWhole(t, owner, r, []ResourceID{id}, 1)
}
