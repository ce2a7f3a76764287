package governor

import (
	"runtime"
	"testing"
	"time"
)

//go:noinline
func adv32DropLease(g *Governor) { g.AcquireMany(2, 1<<20) }

// TestAdv32DroppedLeaseIsReturned: a LeaseSet dropped without Release keeps
// its workers and bytes charged for the life of the process; with them gone
// every Acquire blocks forever. orbitpool's guards have a garbage-collector
// safety net for the same mistake; the governor's leases have none.
func TestAdv32DroppedLeaseIsReturned(t *testing.T) {
	g := New(2, 4<<20)
	adv32DropLease(g)
	for i := 0; i < 50 && g.Outstanding() != 0; i++ {
		runtime.GC()
		time.Sleep(10 * time.Millisecond)
	}
	if o, r := g.Outstanding(), g.ReservedBytes(); o != 0 || r != 0 {
		t.Fatalf("a dropped lease is still charged after the garbage collector ran: %d workers, %d bytes; want 0, 0", o, r)
	}
}
