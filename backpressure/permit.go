package backpressure

import (
	"runtime"
	"sync/atomic"
	"weak"
)

// Permit is the right to run one unit of work under a [Limiter]'s cap.
//
// Release is the only way a permit returns on time. A Permit that is
// garbage-collected without Release returns then, and counts in
// [Limiter.Leaked]: a caller's bug costs capacity until a collection finds
// it rather than for the life of the process. That is a safety net, not a
// way to release: the permit stays taken until the collector finds it, and
// permits are found a batch at a time (see permitBatch), so one dropped
// while another handed out around the same time is still reachable comes
// back only once that one is unreachable too.
//
// The caller's *Permit points into its batch, and so does a copy of the
// Permit value, which keeps the batch from being collected while the
// caller can still use either.
type Permit struct {
	b *permitBatch
	i int
}

// Permits are carved out of batches, with one cleanup per batch: a cleanup
// per permit costs several times the Acquire/Release pair it guards. A
// batch's cleanup runs once none of its Permits is reachable, and returns
// those never released. The pool holds the batch it is carving only weakly,
// so that a leaked permit is found by a collection even if nothing is ever
// acquired again.
const permitBatchSize = 256

type permitBatch struct {
	permits [permitBatchSize]Permit
	state   *batchState
}

// batchState is what a batch's cleanup reads, apart from the batch so that
// the cleanup does not keep it reachable.
type batchState struct {
	p        *pool
	next     atomic.Int32 // permits handed out, or claimed past the end
	released [permitBatchSize]atomic.Bool
}

// permit hands out a Permit for a unit the caller has taken.
func (p *pool) permit() *Permit {
	for {
		cur := p.batch.Load()
		if b := cur.Value(); b != nil {
			if i := b.state.next.Add(1) - 1; i < permitBatchSize {
				pm := &b.permits[i]
				*pm = Permit{b, int(i)}
				return pm
			}
		}
		p.batch.CompareAndSwap(cur, p.newPermitBatch())
	}
}

func (p *pool) newPermitBatch() *weak.Pointer[permitBatch] {
	b := &permitBatch{state: &batchState{p: p}}
	runtime.AddCleanup(b, returnLeaked, b.state)
	w := weak.Make(b)
	return &w
}

func returnLeaked(st *batchState) {
	n, leaked := min(st.next.Load(), permitBatchSize), 0
	for i := range st.released[:n] {
		if st.released[i].CompareAndSwap(false, true) {
			st.p.leaked.Add(1)
			st.p.release()
			leaked++
		}
	}
	if leaked > 0 && st.p.onLeak != nil {
		st.p.onLeak(leaked)
	}
}

// Release gives the permit back, handing it to the longest waiter if there is
// one. Only the first call has an effect, so a deferred Release is safe
// alongside an early one. Release on a nil or zero Permit does nothing.
func (pm *Permit) Release() {
	if pm == nil || pm.b == nil {
		return
	}
	st := pm.b.state
	if st.released[pm.i].CompareAndSwap(false, true) {
		st.p.release()
	}
	// Until the release is done, pm keeps its batch from the collector,
	// whose cleanup would otherwise count the permit as leaked.
	runtime.KeepAlive(pm)
}
