package governor

import (
	"context"
	"sync/atomic"
)

// LeaseSet is a grant of workers and memory from a [Governor], held until
// Release.
type LeaseSet struct {
	g     *Governor
	bytes uint64        // memory charged to g
	held  uint32        // workers charged to g; at most MaxWorkers
	flags atomic.Uint32 // leaseBorrowed, fixed at creation; leaseReleased
}

const (
	// leaseBorrowed marks a lease that counts one more worker than it holds:
	// the one lent by the lease in the caller's context.
	leaseBorrowed = 1 << iota
	leaseReleased
)

func newLease(g *Governor, held, bytes uint64, borrowed bool) *LeaseSet {
	ls := &LeaseSet{g: g, bytes: bytes, held: uint32(held)}
	if borrowed {
		ls.flags.Store(leaseBorrowed)
	}
	return ls
}

func (ls *LeaseSet) released() bool { return ls.flags.Load()&leaseReleased != 0 }

// Workers is how many workers the holder may run at once. For a lease
// acquired under [WithLease] it counts the worker the caller is already
// running on.
func (ls *LeaseSet) Workers() int {
	n := int(ls.held)
	if ls.flags.Load()&leaseBorrowed != 0 {
		n++
	}
	return n
}

// Bytes is the memory charged to this lease.
func (ls *LeaseSet) Bytes() uint64 { return ls.bytes }

// Release returns the workers and memory to the governor and wakes waiters.
// Only the first call has an effect, so a deferred Release is safe alongside
// an early one. Release on a nil LeaseSet does nothing.
func (ls *LeaseSet) Release() {
	if ls == nil || ls.flags.Or(leaseReleased)&leaseReleased != 0 {
		return
	}
	if ls.held != 0 {
		ls.g.release(uint64(ls.held), ls.bytes)
	}
}

type leaseKey struct{}

// WithLease returns a context that tells acquires made under it that the
// caller already holds ls.
//
// Holding one lease while waiting for another is what deadlocks a shared
// budget. Passing the lease down instead lets inner code ask the same
// governor for helpers: [Governor.AcquireManyContext] then lends it the
// worker it is running on and adds only what is free, without waiting.
func WithLease(ctx context.Context, ls *LeaseSet) context.Context {
	return context.WithValue(ctx, leaseKey{}, ls)
}
