package orbitpool

import (
	"errors"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

func init() { mpMoreRoles["adv76a-claimer-killed"] = adv76aRoleClaimerKilled }

// holdNextClaim makes the next claim of this process (an Accept's or a
// withdrawal's first step) run held up between its two steps.
func holdNextClaim(t *testing.T, held func()) {
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

// TestAdv76aStalledClaimSparesNextLease: Accept and Withdraw are two steps
// each: take the lease's ticket, then turn its pending bit into a use or
// clear it. A claimer held up between the two for longer than
// ReservationTimeout (a descheduled process) must find its bit as it left
// it: Reconcile must not age it, and no new reservation may take it, else
// the second step acts on a newer lease: clears a live reservation nobody
// withdrew, or accepts an aged one on the new one's unit. Once the claimer
// finishes, the unit is where it says, and the next lease is good.
func TestAdv76aStalledClaimSparesNextLease(t *testing.T) {
	for _, name := range []string{"withdraw", "accept"} {
		t.Run(name, func(t *testing.T) {
			spec := PoolSpec{Lanes: 4, Keys: 2, ResourcesPerLane: 2, Path: filepath.Join(t.TempDir(), "seg")}
			timeout := 20 * time.Millisecond
			open := opener(t, spec, Options{ReconcileInterval: time.Hour, ReservationTimeout: timeout})
			owner, r1, r2 := open(), open(), open()
			id, err := owner.Register(Key{0xa76d, 1}, 1)
			if err != nil {
				t.Fatal(err)
			}
			l1, err := r1.Reserve(id)
			if err != nil {
				t.Fatal(err)
			}
			holdNextClaim(t, func() {
				for range 10 {
					if err := owner.Reconcile(); err != nil {
						t.Error(err)
					}
					time.Sleep(timeout / 2)
				}
				if n, _ := owner.Users(id); n != 1 {
					t.Errorf("Reconcile aged out a reservation claimed %s ago by a live %s: %d users", 5*timeout, name, n)
				}
				if l2, err := r2.Reserve(id); !errors.Is(err, ErrBusy) {
					t.Errorf("a new reservation while the claim was held: %+v, %v; want ErrBusy (the one unit is claimed)", l2, err)
				}
			})
			if name == "withdraw" {
				r1.Withdraw(l1)
			} else {
				e, err := owner.Accept(l1)
				if err != nil {
					t.Fatalf("Accept held up past the reservation timeout after it took the ticket: %v", err)
				}
				if n, _ := owner.Users(id); n != 1 {
					t.Errorf("after the accept: %d users, want 1", n)
				}
				e.Complete()
			}
			idleAndServing(t, owner, r2, id)
		})
	}
}

// idleAndServing fails t unless id's slot holds no use, reservation,
// ticket or claim, and serves r's next lease.
func idleAndServing(t *testing.T, owner, r *Pool, id ResourceID) {
	t.Helper()
	if n, _ := owner.Users(id); n != 0 {
		t.Errorf("%d users and reservations left, want 0", n)
	}
	noTickets(t, owner, id)
	l, err := r.Reserve(id)
	if err != nil {
		t.Fatalf("the next reservation: %v", err)
	}
	e, err := owner.Accept(l)
	if err != nil {
		t.Fatalf("Accept of the next lease: %v", err)
	}
	e.Complete()
}

// noTickets fails t if a ticket or a claim is left on id's slot.
func noTickets(t *testing.T, p *Pool, id ResourceID) {
	t.Helper()
	s := p.seg
	off := s.slotOff(id.Lane(), id.Slot())
	for b := range PendingReservations {
		if tk := atomic.LoadUint64(s.u64(off + slTickets + 8*b)); tk != 0 {
			t.Errorf("ticket %d of the slot is %#x after every reservation ended (claim: %v)", b, tk, isClaim(tk))
		}
	}
}

// adv76aRoleClaimerKilled reserves c.args.IDs[0], then withdraws it and
// stops between the claim and the bit's release, to be killed there.
func adv76aRoleClaimerKilled(c *mpChildCtx) error {
	p, err := c.open()
	if err != nil {
		return err
	}
	l, err := p.Reserve(c.args.IDs[0])
	if err != nil {
		return err
	}
	h := func() {
		c.send(mpMsg{Type: "claimed"})
		time.Sleep(time.Minute)
	}
	testHookClaimed.Store(&h)
	p.Withdraw(l)
	return errors.New("not killed")
}

// TestAdv76aKilledClaimerFinished: a process killed between the two steps
// of a withdrawal leaves its claim on the ticket and the bit set. The owner's
// Reconcile, once the claimer's life is over, gives the unit back and frees
// the ticket: the resource serves the next lease.
func TestAdv76aKilledClaimerFinished(t *testing.T) {
	spec := PoolSpec{Lanes: 4, Keys: 2, ResourcesPerLane: 2, Path: filepath.Join(t.TempDir(), "seg")}
	open := opener(t, spec, Options{ReconcileInterval: time.Hour, ReservationTimeout: time.Hour})
	owner := open()
	id, err := owner.Register(Key{0xa76d, 2}, 1)
	if err != nil {
		t.Fatal(err)
	}
	c := mpStart(t, "adv76a-claimer-killed", mpArgs{Spec: spec, IDs: []ResourceID{id}, Reconcile: time.Hour, ResTimeout: time.Hour, Lifetime: 30 * time.Second})
	c.expect("claimed", 10*time.Second)
	c.kill()
	if n, _ := owner.Users(id); n != 1 {
		t.Fatalf("setup: %d users with the claim held, want 1", n)
	}
	if err := owner.Reconcile(); err != nil {
		t.Fatal(err)
	}
	idleAndServing(t, owner, open(), id)
}
