package orbitpool

import (
	"errors"
	"testing"
)

// TestWithdrawFreesTheUnit: a reservation its reserver withdraws leaves the
// resource with room at once, and its lease can no longer be accepted; a
// lease already accepted is not withdrawn, nor is one withdrawn twice.
func TestWithdrawFreesTheUnit(t *testing.T) {
	ps := openShared(t, small, 2)
	owner, reserver := ps[0], ps[1]
	k := Key{0x77, 0x64}
	id, err := owner.Register(k, 1)
	if err != nil {
		t.Fatal(err)
	}
	l, err := reserver.Reserve(id)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := reserver.Reserve(id); !errors.Is(err, ErrBusy) {
		t.Fatalf("second reservation on a resource of capacity 1: %v, want ErrBusy", err)
	}
	reserver.Withdraw(l)
	reserver.Withdraw(l)
	if _, err := owner.Accept(l); !errors.Is(err, ErrStale) {
		t.Fatalf("accepting a withdrawn lease: %v, want ErrStale", err)
	}
	l2, err := reserver.Reserve(id)
	if err != nil {
		t.Fatalf("reserving after the withdrawal: %v", err)
	}
	e, err := owner.Accept(l2)
	if err != nil {
		t.Fatal(err)
	}
	reserver.Withdraw(l2)
	if _, err := reserver.Reserve(id); !errors.Is(err, ErrBusy) {
		t.Fatalf("reserving while an accepted lease's use runs, after withdrawing it: %v, want ErrBusy", err)
	}
	e.Complete()
	if _, err := reserver.Reserve(id); err != nil {
		t.Fatalf("reserving after the use completed: %v", err)
	}
}
