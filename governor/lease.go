package governor

import (
	"context"
	"runtime"
	"sync/atomic"
	"weak"
)

// LeaseSet is a grant of workers and memory from a [Governor], held until
// Release.
//
// Release is the only way a lease returns on time. A LeaseSet that is
// garbage-collected without Release returns its workers and memory then, and
// counts in [Governor.Leaked]: a caller's bug costs capacity until a
// collection finds it rather than for the life of the process. That is a
// safety net, not a way to release: the lease stays charged until the
// collector finds it, and leases are found a batch at a time (see
// leaseBatch), so one dropped while another handed out around the same time
// is still reachable comes back only once that one is unreachable too.
//
// The caller's *LeaseSet points into its batch, and so does a copy of the
// LeaseSet value, which keeps the batch from being collected while the
// caller can still use either.
type LeaseSet struct {
	b *leaseBatch
	*lease
}

// lease is a LeaseSet's charge, in its batch's state.
type lease struct {
	bytes uint64        // memory charged to g
	held  uint32        // workers charged to g; at most MaxWorkers
	flags atomic.Uint32 // leaseHeld, once bytes and held are set; leaseBorrowed
}

const (
	// leaseHeld marks a lease handed out and not yet released, by Release
	// or by its batch's cleanup.
	leaseHeld = 1 << iota
	// leaseBorrowed marks a lease that counts one more worker than it holds:
	// the one lent by the lease in the caller's context.
	leaseBorrowed
)

// LeaseSets are carved out of batches, with one cleanup per batch: a cleanup
// per lease costs several times the Acquire/Release pair it guards. A batch's
// cleanup runs once none of its LeaseSets is reachable, and returns the
// charges of those never released. The governor holds the batch it is carving
// only weakly, so that a leaked lease is found by a collection even if
// nothing is ever acquired again.
const leaseBatchSize = 256

type leaseBatch struct {
	sets  [leaseBatchSize]LeaseSet
	state *leaseBatchState
	next  atomic.Int32 // leases handed out, or claimed past the end
}

// leaseBatchState is what a batch's cleanup reads, apart from the batch so
// that the cleanup does not keep it reachable.
type leaseBatchState struct {
	g      *Governor
	leases [leaseBatchSize]lease
}

// newLease hands out a LeaseSet for workers and bytes the caller has taken.
func (g *Governor) newLease(held, bytes uint64, borrowed bool) *LeaseSet {
	flags := uint32(leaseHeld)
	if borrowed {
		flags |= leaseBorrowed
	}
	for {
		cur := g.batch.Load()
		if b := cur.Value(); b != nil {
			if i := b.next.Add(1) - 1; i < leaseBatchSize {
				l := &b.state.leases[i]
				l.bytes, l.held = bytes, uint32(held)
				l.flags.Store(flags)
				ls := &b.sets[i]
				*ls = LeaseSet{b, l}
				return ls
			}
		}
		g.batch.CompareAndSwap(cur, g.newLeaseBatch())
	}
}

func (g *Governor) newLeaseBatch() *weak.Pointer[leaseBatch] {
	b := &leaseBatch{state: &leaseBatchState{g: g}}
	runtime.AddCleanup(b, returnLeaked, b.state)
	w := weak.Make(b)
	return &w
}

func returnLeaked(st *leaseBatchState) {
	leaked := 0
	for i := range st.leases {
		// Leases never handed out were never held.
		if l := &st.leases[i]; l.release(st.g) {
			st.g.leaked.Add(1)
			leaked++
		}
	}
	if f := st.g.onLeak.Load(); leaked > 0 && f != nil {
		(*f)(leaked)
	}
}

// release returns the charge if the lease is still held, and reports whether
// it was.
func (l *lease) release(g *Governor) bool {
	if l.flags.And(^uint32(leaseHeld))&leaseHeld == 0 {
		return false
	}
	if l.held != 0 {
		g.release(uint64(l.held), l.bytes)
	}
	return true
}

func (ls *LeaseSet) released() bool { return ls.flags.Load()&leaseHeld == 0 }

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
	if ls != nil {
		ls.release(ls.gov())
		// Until the release is done, ls keeps its batch from the
		// collector, whose cleanup would otherwise count it as leaked.
		runtime.KeepAlive(ls)
	}
}

// gov is the governor that granted ls; nil for a LeaseSet no governor
// granted (a zero one), which WithLease then treats as no lease.
func (ls *LeaseSet) gov() *Governor {
	if ls.b == nil {
		return nil
	}
	return ls.b.state.g
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
