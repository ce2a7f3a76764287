package governor

import (
	"runtime"
	"testing"
	"time"
)

//go:noinline
func adv37CopyLease(g *Governor) LeaseSet { return *g.AcquireMany(2, 1<<20) }

// TestAdv37CopiedLeaseStaysCharged: a LeaseSet is a plain struct that the
// caller may copy (nothing in it makes go vet object, as the atomic it held
// before the collector's safety net did). A copy is the lease as much as
// the *LeaseSet it came from: while the copy is reachable, the collector
// must not return its workers and memory, or they are granted twice.
func TestAdv37CopiedLeaseStaysCharged(t *testing.T) {
	g := New(2, 4<<20)
	held := adv37CopyLease(g)
	for range 20 {
		runtime.GC()
		time.Sleep(time.Millisecond)
	}
	if o, r, leaked := g.Outstanding(), g.ReservedBytes(), g.Leaked(); o != 2 || r != 2<<20 || leaked != 0 {
		t.Errorf("a copied lease still held: %d workers, %d bytes, Leaked %d; want 2, %d, 0", o, r, leaked, 2<<20)
	}
	if ls, ok := g.TryAcquire(); ok {
		ls.Release()
		t.Errorf("2 workers with a copied lease of 2 held: TryAcquire granted one")
	}
	if w := held.Workers(); w != 2 {
		t.Errorf("the copy's Workers: %d, want 2", w)
	}
	held.Release()
	if o, r := g.Outstanding(), g.ReservedBytes(); o != 0 || r != 0 {
		t.Fatalf("after the copy's Release: %d workers, %d bytes; want 0, 0", o, r)
	}
}
