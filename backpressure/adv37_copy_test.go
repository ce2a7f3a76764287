package backpressure

import (
	"context"
	"errors"
	"runtime"
	"testing"
	"time"
)

//go:noinline
func adv37CopyPermit(t *testing.T, l *Limiter) Permit {
	pm, err := l.TryAcquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return *pm
}

// TestAdv37CopiedPermitStaysHeld: a Permit is a plain struct that the
// caller may copy (into a struct field, say; nothing in it makes go vet
// object, as the atomic.Bool it held before the collector's safety net
// did). A copy is the permit as much as the *Permit it came from: while
// the copy is reachable, the collector must not return the permit, or
// the cap is exceeded while its holder still runs under it.
func TestAdv37CopiedPermitStaysHeld(t *testing.T) {
	l := New(WithCap(1))
	held := adv37CopyPermit(t, l)
	for range 20 {
		runtime.GC()
		time.Sleep(time.Millisecond)
	}
	if n, leaked := l.Active(), l.Leaked(); n != 1 || leaked != 0 {
		t.Errorf("a copied permit still held: Active %d, Leaked %d; want 1, 0", n, leaked)
	}
	if pm, err := l.TryAcquire(context.Background()); !errors.Is(err, ErrSaturated) {
		pm.Release()
		t.Errorf("cap 1 with a copied permit held: TryAcquire gave %v, want ErrSaturated", err)
	}
	held.Release()
	if n := l.Active(); n != 0 {
		t.Fatalf("Active %d after the copy's Release, want 0", n)
	}
}
