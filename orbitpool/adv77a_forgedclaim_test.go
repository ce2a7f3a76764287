package orbitpool

import (
	"errors"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// TestAdv77aForgedClaimMarks: hostile claim marks written into a ticket
// word of an idle resource, with its pending bit set (the unit looks held
// by a claimer between its two steps) or clear. A mark naming a lane that
// does not exist, a free lane, or a live lane in another life is a claim
// whose life ended: the owner's next Reconcile gives the unit back and
// frees the ticket. A mark naming a live sibling in its present life holds
// the unit (a live claimer finishes, however long it is held up) only
// until that sibling leaves; then Reconcile finishes it. Every Reconcile
// returns promptly, and the resource serves its whole capacity after.
func TestAdv77aForgedClaimMarks(t *testing.T) {
	spec := PoolSpec{Lanes: 4, Keys: 4, ResourcesPerLane: 2, Path: filepath.Join(t.TempDir(), "seg")}
	opts := Options{ReconcileInterval: time.Hour, ReservationTimeout: time.Hour}
	owner := adv77aOpen(t, spec, opts)
	sib, err := Open(spec, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer sib.Close()
	r := adv77aOpen(t, spec, opts)
	id, err := owner.Register(Key{0xa77a, 20}, 1)
	if err != nil {
		t.Fatal(err)
	}
	s := owner.seg
	off := s.slotOff(id.Lane(), id.Slot())
	word := s.u64(off + slWord)
	forge := func(b int, mark uint64, setBit bool) {
		atomic.StoreUint64(s.u64(off+slTickets+8*b), mark)
		if setBit {
			atomic.OrUint64(word, 1<<b)
		}
	}
	reconcile := func() {
		t.Helper()
		start := time.Now()
		if err := owner.Reconcile(); err != nil {
			t.Errorf("Reconcile: %v", err)
		}
		if d := time.Since(start); d > adv77aBound {
			t.Errorf("Reconcile took %v", d)
		}
	}
	serves := func(what string) {
		t.Helper()
		if n, err := owner.Users(id); n != 0 || err != nil {
			t.Fatalf("%s: %d users and reservations (%v), want 0", what, n, err)
		}
		noTickets(t, owner, id)
		idleAndServing(t, owner, r, id)
	}
	free := -1
	for l := range spec.Lanes {
		if l != owner.lane && l != sib.lane && l != r.lane {
			free = l
		}
	}
	dead := []struct {
		name string
		mark uint64
	}{
		{"lane out of range", makeTicket(200, 1, 5) | claimFlag},
		{"free lane", makeTicket(free, 1, 5) | claimFlag},
		{"sibling's other life", makeTicket(sib.lane, sib.laneGen+1, 5) | claimFlag},
		{"owner's other life", makeTicket(owner.lane, owner.laneGen+7, 5) | claimFlag},
	}
	for _, d := range dead {
		for _, setBit := range []bool{true, false} {
			b := 3
			if setBit {
				b = 0
			}
			forge(b, d.mark, setBit)
			if setBit {
				if l, err := r.Reserve(id); !errors.Is(err, ErrBusy) {
					t.Fatalf("%s: a reservation with the forged claim's bit set: %+v, %v; want ErrBusy", d.name, l, err)
				}
			}
			reconcile()
			serves(d.name)
		}
	}
	// A live sibling's claim in its present life: held while it lives.
	forge(1, makeTicket(sib.lane, sib.laneGen, 9)|claimFlag, true)
	reconcile()
	if _, err := r.Reserve(id); !errors.Is(err, ErrBusy) {
		t.Fatalf("a live claimer's unit was given away: %v", err)
	}
	if err := sib.Close(); err != nil {
		t.Fatal(err)
	}
	reconcile()
	serves("the claimer's lane left")
}
