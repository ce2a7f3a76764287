package orbitpool

import (
	"errors"
	"path/filepath"
	"testing"
	"time"
)

// TestAdv76bClosedClaimerSparesNextLease: a withdrawal is two steps: claim
// the lease's ticket, then clear its pending bit. The pool that withdraws
// is Closed by another goroutine of its (still running) process between
// the two steps. Were the lane released then, the owner's Reconcile would
// take the claim for a dead process's, give the unit back and free the
// ticket, and a new reservation could take the bit that the withdrawal's
// second step then clears. So Close waits for the withdrawal: meanwhile the
// claim holds the unit, and afterwards the unit is back, no ticket is left,
// and the next lease is good.
func TestAdv76bClosedClaimerSparesNextLease(t *testing.T) {
	spec := PoolSpec{Lanes: 4, Keys: 2, ResourcesPerLane: 2, Path: filepath.Join(t.TempDir(), "seg")}
	const timeout = 50 * time.Millisecond
	open := opener(t, spec, Options{ReconcileInterval: time.Hour, ReservationTimeout: timeout})
	owner, r1, r2 := open(), open(), open()
	id, err := owner.Register(Key{0xa76b, 1}, 1)
	if err != nil {
		t.Fatal(err)
	}
	l1, err := r1.Reserve(id)
	if err != nil {
		t.Fatal(err)
	}
	closed := make(chan error, 1)
	holdNextClaim(t, func() {
		// Another goroutine of r1's process closes it meanwhile.
		go func() { closed <- r1.Close() }()
		for range 4 {
			if err := owner.Reconcile(); err != nil {
				t.Errorf("Reconcile: %v", err)
			}
			time.Sleep(timeout)
		}
		select {
		case err := <-closed:
			t.Errorf("Close returned (%v) with the pool's withdrawal between its two steps", err)
		default:
		}
		if l2, err := r2.Reserve(id); !errors.Is(err, ErrBusy) {
			t.Errorf("a reservation while the closing pool's claim was held: %+v, %v; want ErrBusy (the one unit is claimed)", l2, err)
		}
	})
	r1.Withdraw(l1)
	select {
	case err := <-closed:
		if err != nil {
			t.Errorf("Close: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close still waits 5s after the withdrawal ended")
	}
	idleAndServing(t, owner, r2, id)
}

var _ = errors.Is
