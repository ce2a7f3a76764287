package backpressure

import (
	"context"
	"runtime"
	"testing"
	"time"
)

//go:noinline
func adv32DropPermit(t *testing.T, l *Limiter) {
	if _, err := l.TryAcquire(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// TestAdv32DroppedPermitIsReturned: a Permit that its holder drops without
// Release (a path that forgot it, a panic between Acquire and the deferred
// Release) is never given back: the cap shrinks by one for the life of the
// process, and with a small cap the process ends up refusing everything.
// orbitpool's Execution and CreationPermit have a safety net for exactly
// this (a cleanup that returns the unit and reports ErrLeakedGuard); the
// Limiter's permits, which cap the same requests, have none.
func TestAdv32DroppedPermitIsReturned(t *testing.T) {
	l := New(WithCap(1))
	adv32DropPermit(t, l)
	for i := 0; i < 50 && l.Active() != 0; i++ {
		runtime.GC()
		time.Sleep(10 * time.Millisecond)
	}
	if n := l.Active(); n != 0 {
		t.Fatalf("a dropped permit is still held after the garbage collector ran: Active %d, want 0", n)
	}
	if _, err := l.TryAcquire(context.Background()); err != nil {
		t.Fatalf("cap 1 after a dropped permit: %v", err)
	}
}
