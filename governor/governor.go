package governor

import (
	"container/list"
	"math"
	"sync"
	"sync/atomic"
	"weak"
)

// MaxWorkers is the most workers a Governor has (New takes a larger count
// as this one): far above any machine, low enough that the count stays
// inside the low half of the state word and that the charges of all workers
// together fit in a uint64 (see maxPerWorkerBytes).
const MaxWorkers = 1 << 20

// Governor is the single source of parallelism in the process.
//
// Work units acquire LeaseSets rather than being handed a worker count, which
// is what makes nested parallelism safe: an outer fan-out and an inner
// multi-stream relay both draw from this one pool, so their product can never
// exceed the budget. The memory budget sizes voluntary parallelism; the hard
// ceiling is the worker count (see [Governor.AcquireMany]).
//
// A Governor is safe for concurrent use. Create one per process and share it.
type Governor struct {
	workers     uint64 // fixed at construction
	memoryLimit uint64 // fixed at construction; math.MaxUint64 means no budget

	// state packs the workers in use (low 32 bits) and the number of queued
	// waiters (high 32 bits) into one word, so that "is anyone waiting?" and
	// "take a worker" are decided by the same compare-and-swap. That is what
	// keeps the uncontended path lock-free and what lets a waiter register
	// without missing a release that races with it.
	state atomic.Uint64

	// reserved is the memory charged to unreleased leases. A claim charges it
	// before taking workers and undoes the charge if that fails, so an
	// observer may briefly see a charge that is then withdrawn.
	reserved atomic.Uint64

	mu    sync.Mutex
	queue list.List // of *waiter, in arrival order; guarded by mu

	batch  atomic.Pointer[weak.Pointer[leaseBatch]] // never nil; see leaseBatch
	leaked atomic.Uint64                            // leases returned by the collector
	onLeak atomic.Pointer[func(n int)]              // see OnLeak
}

// New returns a Governor with a budget of workers and memoryLimit bytes.
//
// workers below 1 is raised to 1: a budget that can grant nothing would hang
// every caller. A memoryLimit of 0 means no memory budget, so that grants are
// bounded by workers alone; bytes are still counted in [Governor.ReservedBytes].
func New(workers int, memoryLimit uint64) *Governor {
	w := uint64(max(workers, 1))
	w = min(w, MaxWorkers)
	if memoryLimit == 0 {
		memoryLimit = math.MaxUint64
	}
	g := &Governor{workers: w, memoryLimit: memoryLimit}
	g.batch.Store(new(weak.Pointer[leaseBatch]))
	return g
}

// Workers is the hard ceiling on workers held at once.
func (g *Governor) Workers() int { return int(g.workers) }

// MemoryLimit is the memory budget in bytes; math.MaxUint64 when there is
// none.
func (g *Governor) MemoryLimit() uint64 { return g.memoryLimit }

// Outstanding is the number of workers currently held by unreleased leases.
func (g *Governor) Outstanding() int { return int(uint32(g.state.Load())) }

// Leaked is how many LeaseSets were garbage-collected without Release; the
// collector returned whatever workers and memory they held. Anything above
// zero is a bug in a caller: a path that drops a lease, or a panic between
// an acquire and a Release that is not deferred.
func (g *Governor) Leaked() uint64 { return g.leaked.Load() }

// OnLeak has f told how many LeaseSets the collector returned each time it
// finds dropped ones (see [Governor.Leaked]), so that a caller's bug is
// reported where it happens rather than only counted; nil stops that. f
// runs on the runtime's cleanup goroutine: it must not block.
func (g *Governor) OnLeak(f func(n int)) {
	if f == nil {
		g.onLeak.Store(nil)
		return
	}
	g.onLeak.Store(&f)
}

// ReservedBytes is the memory currently charged to unreleased leases. It can
// exceed [Governor.MemoryLimit]; see [Governor.AcquireMany].
func (g *Governor) ReservedBytes() uint64 { return g.reserved.Load() }

// WorkersFor is how many workers a unit needing perWorkerBytes each could be
// granted right now.
//
// It is a hint for sizing work before committing, and it reserves nothing:
// two concurrent callers get the same answer, and a later AcquireMany may
// grant fewer. Like a grant, the answer is never below one.
func (g *Governor) WorkersFor(perWorkerBytes uint64) int {
	used := uint64(uint32(g.state.Load()))
	free := g.workers - min(used, g.workers)
	return int(max(g.fit(free, free, perWorkerBytes, g.reserved.Load()), 1))
}

// fit is min(want, free, memory free / perWorkerBytes), the grant before the
// floor of one is applied.
func (g *Governor) fit(want, free, perWorkerBytes, reserved uint64) uint64 {
	k := min(want, free)
	if perWorkerBytes == 0 || g.memoryLimit == math.MaxUint64 {
		return k
	}
	var memFree uint64
	if reserved < g.memoryLimit {
		memFree = g.memoryLimit - reserved
	}
	return min(k, memFree/perWorkerBytes)
}

// maxPerWorkerBytes clamps a per-worker demand so that the sum of every
// charge the governor can hold (at most MaxWorkers workers) fits in a uint64.
// The bound is 16 TiB per worker: a demand above it is larger than any real
// budget, so the clamp changes no grant, only what is reported.
const maxPerWorkerBytes = math.MaxUint64/MaxWorkers - 1

func clampPerWorker(perWorkerBytes uint64) uint64 {
	return min(perWorkerBytes, maxPerWorkerBytes)
}
