package orbitpool

import (
	"testing"
	"time"
)

//go:noinline
func adv39CopyExecution(t *testing.T, p *Pool, k Key) Execution {
	return *advAcquire(t, p, k)
}

// TestAdv39CopiedExecutionStaysHeld: an Execution is a plain struct its
// holder may copy (nothing in it makes go vet object), as a Permit or a
// LeaseSet (adv37). While the copy is reachable the unit is in use: the
// batch's cleanup must not give it back, or the resource's capacity is
// exceeded while the copy's holder still runs on it.
func TestAdv39CopiedExecutionStaysHeld(t *testing.T) {
	backings(t, func(t *testing.T, p *Pool) {
		k := Key{0xad39, 1}
		if _, err := p.Register(k, 1); err != nil {
			t.Fatal(err)
		}
		held := adv39CopyExecution(t, p, k)
		gcUntil(300*time.Millisecond, func() bool { p.Reconcile(); return false })
		if ks, n := keyStats(t, p, k), p.LeakedGuards(); ks.InUse != 1 || n != 0 {
			t.Errorf("a copied Execution still held: %d in use, %d leaked guards; want 1, 0", ks.InUse, n)
		}
		held.Complete()
		if ks := keyStats(t, p, k); ks.InUse != 0 {
			t.Fatalf("%d in use after the copy's Complete, want 0", ks.InUse)
		}
	})
}

//go:noinline
func adv39CopyPermit(t *testing.T, p *Pool, k Key) CreationPermit {
	cp, err := p.ClaimCreate(k, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	return *cp
}

// TestAdv39CopiedCreationPermitStaysHeld: the same for a CreationPermit: a
// copy still held keeps its creation unit taken.
func TestAdv39CopiedCreationPermitStaysHeld(t *testing.T) {
	backings(t, func(t *testing.T, p *Pool) {
		k := Key{0xad39, 2}
		held := adv39CopyPermit(t, p, k)
		gcUntil(300*time.Millisecond, func() bool { p.Reconcile(); return false })
		if ks, n := keyStats(t, p, k), p.LeakedGuards(); ks.Creating != 1 || n != 0 {
			t.Errorf("a copied CreationPermit still held: %d creating, %d leaked guards; want 1, 0", ks.Creating, n)
		}
		held.Close()
		if ks := keyStats(t, p, k); ks.Creating != 0 {
			t.Fatalf("%d creating after the copy's Close, want 0", ks.Creating)
		}
	})
}
