package orbitpool

import (
	"errors"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// TestAdv77aForgedOwnClaimMark: a claim mark naming the owner's own lane in
// its present life, written over the ticket of a set pending bit, when the
// owner has no Accept or withdrawal under way: only a corrupt word leaves
// it. Like an orphan bit (a set bit with no ticket), it holds the unit for
// good unless Reconcile drops it; the owner knows its own claims, so after
// a reservation timeout its Reconcile must give the unit back.
func TestAdv77aForgedOwnClaimMark(t *testing.T) {
	spec := PoolSpec{Lanes: 2, Keys: 2, ResourcesPerLane: 2, Path: filepath.Join(t.TempDir(), "seg")}
	const timeout = 20 * time.Millisecond
	opts := Options{ReconcileInterval: time.Hour, ReservationTimeout: timeout}
	owner := adv77aOpen(t, spec, opts)
	r := adv77aOpen(t, spec, opts)
	id, err := owner.Register(Key{0xa77a, 40}, 1)
	if err != nil {
		t.Fatal(err)
	}
	s := owner.seg
	off := s.slotOff(id.Lane(), id.Slot())
	atomic.StoreUint64(s.u64(off+slTickets), makeTicket(owner.lane, owner.laneGen, 12345)|claimFlag)
	atomic.OrUint64(s.u64(off+slWord), 1)
	if _, err := r.Reserve(id); !errors.Is(err, ErrBusy) {
		t.Fatalf("Reserve with the forged claim's bit set: %v, want ErrBusy", err)
	}
	for range 5 {
		if err := owner.Reconcile(); err != nil {
			t.Errorf("Reconcile: %v", err)
		}
		time.Sleep(timeout)
	}
	if n, _ := owner.Users(id); n != 0 {
		t.Fatalf("the owner's own forged claim still holds %d unit(s) after 5 reservation timeouts, with no Accept or withdrawal of the owner under way", n)
	}
	noTickets(t, owner, id)
	idleAndServing(t, owner, r, id)
}
