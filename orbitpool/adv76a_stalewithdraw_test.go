package orbitpool

import (
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// TestAdv76aStalledWithdrawSparesNextLease: Withdraw (ungrant) and Accept
// are two steps each: take the lease's ticket, then clear (or turn into a
// use) the pending bit, validated only by the slot's generation and the bit.
// Between the two the bit has no ticket; Reconcile ages such an orphan bit
// after ReservationTimeout, and a new reservation in the same generation may
// then take the same bit. The stalled second step must not act on that new
// reservation: a lease nobody withdrew, that has not aged, must stay
// acceptable, and its unit must stay counted.
//
// The steps are run here in that order (the statements of ungrant and
// Accept, verbatim), as a process descheduled for longer than
// ReservationTimeout between them would run them.
func TestAdv76aStalledWithdrawSparesNextLease(t *testing.T) {
	for _, tc := range []struct {
		name   string
		second func(p *Pool, off int, gen uint64, bit uint64)
	}{
		{"withdraw", func(p *Pool, off int, gen, bit uint64) {
			// ungrant, after its ticket CAS.
			p.dropReservation(off, gen, bit)
		}},
		{"accept", func(p *Pool, off int, gen, bit uint64) {
			// Accept, after its ticket CAS: the loop that turns the bit
			// into a use.
			s := p.seg
			for {
				w := atomic.LoadUint64(s.u64(off + slWord))
				if wGen(w) != gen || w&bit == 0 {
					return
				}
				if atomic.CompareAndSwapUint64(s.u64(off+slWord), w, w&^bit+useOne) {
					return
				}
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
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
			s := owner.seg
			off := s.slotOff(id.Lane(), id.Slot())
			gen := wGen(atomic.LoadUint64(s.u64(off + slWord)))
			// First step of r1's Withdraw (or the owner's Accept): the ticket.
			if !atomic.CompareAndSwapUint64(s.u64(off+slTickets+8*int(l1.Bit)), l1.Ticket, 0) {
				t.Fatal("setup: ticket not taken")
			}
			// The owner ages the orphan bit.
			deadline := time.Now().Add(5 * time.Second)
			for {
				if err := owner.Reconcile(); err != nil {
					t.Fatal(err)
				}
				if n, _ := owner.Users(id); n == 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("setup: orphan bit never aged")
				}
				time.Sleep(timeout / 2)
			}
			// A new reservation, in the same generation, takes the same bit.
			l2, err := r2.Reserve(id)
			if err != nil {
				t.Fatal(err)
			}
			if l2.Bit != l1.Bit {
				t.Fatalf("setup: new lease on bit %d, the stalled one's was %d", l2.Bit, l1.Bit)
			}
			// The stalled second step.
			p := r1
			if tc.name == "accept" {
				p = owner
			}
			tc.second(p, off, gen, 1<<l1.Bit)

			w := atomic.LoadUint64(s.u64(off + slWord))
			if wUse(w) == 0 && wPendN(w) == 0 {
				t.Errorf("the stalled %s of a lease that had aged out cleared the bit of a new, live lease: the slot counts no unit for it (word %#x)", tc.name, w)
			}
			if tc.name == "withdraw" {
				if e, err := owner.Accept(l2); err != nil {
					t.Errorf("Accept of a live lease nobody withdrew, not aged: %v", err)
				} else {
					e.Complete()
				}
			} else {
				if e, err := owner.Accept(l2); err != nil {
					t.Errorf("Accept of a live lease whose bit a stalled Accept of another (aged) lease took as its own use: %v", err)
				} else {
					e.Complete()
				}
			}
		})
	}
}
