package orbitpool

import (
	"fmt"
	"runtime"
	"sync/atomic"
	"time"
)

// Guard states: a guard is handed out held, and its first Complete, Close or
// Register makes it done. Nothing ever makes a done guard held again.
const (
	guardHeld = 1
	guardDone = 2
)

// useGuard is what an Execution stands for. It lives apart from the
// Execution so that a cleanup can read it once the Execution is unreachable,
// and holds no pointer, so that the collector never scans it. Its fields are
// written before the Execution is handed out; its state only ever changes by
// compare-and-swap.
type useGuard struct {
	id    ResourceID
	key   uint32 // the key entry's index, all that giving the unit back needs
	state uint32
}

// Executions are carved out of batches, with one cleanup per batch: a
// cleanup per guard would cost several times the Reserve→Accept→Complete
// cycle it guards. A batch's cleanup runs once none of its Executions is
// reachable, and returns the units of those never completed. The pool holds
// the batch it is carving, and lets go of it at every Reconcile, so that a
// leaked guard in it is found within a reconcile interval and a collection.
const guardBatchSize = 256

type guardBatch struct {
	execs  [guardBatchSize]Execution
	guards *[guardBatchSize]useGuard
	next   atomic.Int32
}

// Execution is the owner's guard over one unit of a resource in use.
// Complete (or Close) gives the unit back and wakes the key's waiters; it is
// the only way capacity returns. An Execution that is garbage-collected
// without Complete gives its unit back then, counts in LeakedGuards and is
// reported to Options.OnError: a caller's bug costs a log line rather than
// capacity for the life of the process. That is a safety net, not a way to
// release: the unit stays taken until the collector finds the guard, and
// guards are found a batch at a time (see guardBatch), so one dropped while
// another Execution made around the same time is still held (a long-lived
// stream) comes back only once that one is released too.
//
// The caller's *Execution points into its batch, and so does a copy of the
// Execution value, which keeps the batch from being collected while the
// caller can still use either.
type Execution struct {
	p *Pool
	g *useGuard
	b *guardBatch // keeps a copy's batch reachable
}

// batchGuards is a batch cleanup's argument. It must not reach the batch.
type batchGuards struct {
	p  *Pool
	gs *[guardBatchSize]useGuard
}

func (p *Pool) newGuardBatch() *guardBatch {
	b := &guardBatch{guards: new([guardBatchSize]useGuard)}
	for i := range b.execs {
		b.execs[i] = Execution{p: p, g: &b.guards[i], b: b}
	}
	runtime.AddCleanup(b, returnLeakedUses, batchGuards{p, b.guards})
	return b
}

// newExecution hands out a guard over one use of id, a resource of key entry k.
func (p *Pool) newExecution(id ResourceID, k int) *Execution {
	for {
		b := p.guards.Load()
		if b != nil {
			if i := b.next.Add(1) - 1; i < guardBatchSize {
				e := &b.execs[i]
				*e.g = useGuard{id: id, key: uint32(k), state: guardHeld}
				return e
			}
		}
		p.guards.CompareAndSwap(b, p.newGuardBatch())
	}
}

func returnLeakedUses(bg batchGuards) {
	p := bg.p
	if p.closed.Load() {
		return
	}
	for i := range bg.gs {
		// Guards never handed out are zero, never held.
		if g := &bg.gs[i]; atomic.CompareAndSwapUint32(&g.state, guardHeld, guardDone) {
			p.completeUse(g)
			p.leaked(fmt.Errorf("orbitpool: an Execution on resource %v was garbage-collected without Complete; its unit is returned: %w", g.id, ErrLeakedGuard))
		}
	}
}

// ID is the resource in use.
func (e *Execution) ID() ResourceID { return e.g.id }

// CountWait adds d to the wait time of the key in use (KeyStats.WaitTime):
// time the use's request waited that Acquire did not see, such as an
// owner's wait for a worker to take up a sibling's lease. It counts only
// while the use is held and its resource registered: an unregistered
// resource's key entry may have gone to another key since.
func (e *Execution) CountWait(d time.Duration) {
	p, g := e.p, e.g
	if d <= 0 || p.closed.Load() || atomic.LoadUint32(&g.state) != guardHeld {
		return
	}
	w := atomic.LoadUint64(p.seg.u64(p.seg.slotOff(p.lane, g.id.Slot()) + slWord))
	if wGen(w) != g.id.Generation() || wState(w) != StateLive {
		return
	}
	p.seg.count(p.lane, int(g.key), stWaitNanos, uint64(d))
}

// Complete ends the use. Calls after the first do nothing, as does a Complete
// on a resource that was unregistered meanwhile.
//
// When the unit goes to a goroutine of this process that waits for it,
// Complete yields the processor, as sync.Mutex does in its starvation mode:
// the waiter then starts its use at once, rather than after whatever the
// caller does next (a proxy writes its own client's response), and the
// resource sits idle for less time between two uses.
func (e *Execution) Complete() {
	if atomic.CompareAndSwapUint32(&e.g.state, guardHeld, guardDone) && e.p.completeUse(e.g) {
		runtime.Gosched()
	}
}

// Close is Complete, for use with defer and io.Closer.
func (e *Execution) Close() error {
	e.Complete()
	return nil
}

// completeUse gives back the guard's use and reports whether it went to a
// waiter of this process.
func (p *Pool) completeUse(g *useGuard) bool {
	if p.closed.Load() {
		return false
	}
	return p.dropUse(p.seg.slotOff(p.lane, g.id.Slot()), g.id.Generation(), int(g.key))
}

// CreationPermit is one unit of a key's creation budget, held while a resource
// is being made. Register turns it into a live resource; Close without
// registering gives the unit back. Exactly one of them takes effect. A permit
// garbage-collected without either gives its unit back then, like an
// Execution.
//
// A copy of the CreationPermit value points to the one its cleanup is
// attached to, which keeps it from being collected while the copy's holder
// can still use it.
type CreationPermit struct {
	*permitState
	anchor *CreationPermit
}

type permitState struct {
	p     *Pool
	slot  int
	gen   uint64
	key   keyRef
	state atomic.Uint32
}

// Creation is rare next to use, so each permit has a cleanup of its own.
func (p *Pool) newPermit(slot int, gen uint64, ref keyRef) *CreationPermit {
	st := &permitState{p: p, slot: slot, gen: gen, key: ref}
	st.state.Store(guardHeld)
	cp := &CreationPermit{permitState: st}
	cp.anchor = cp
	runtime.AddCleanup(cp, returnLeakedPermit, st)
	return cp
}

func returnLeakedPermit(st *permitState) {
	cp := &CreationPermit{permitState: st}
	if st.p.closed.Load() || !cp.take() {
		return
	}
	if err := cp.release(-1); err != nil {
		st.p.leaked(fmt.Errorf("orbitpool: return a garbage-collected creation permit: %w", err))
		return
	}
	st.p.leaked(fmt.Errorf("orbitpool: a CreationPermit for slot %d was garbage-collected without Register or Close; its budget is returned: %w", st.slot, ErrLeakedGuard))
}

// take marks the permit used; only the first caller gets true.
func (st *permitState) take() bool { return st.state.CompareAndSwap(guardHeld, guardDone) }

// untake undoes take when the operation could not happen.
func (st *permitState) untake() { st.state.Store(guardHeld) }

// leaked counts a guard returned by its cleanup and reports it.
func (p *Pool) leaked(err error) {
	p.leakedGuards.Add(1)
	if p.opts.OnError != nil {
		p.opts.OnError(err)
	}
}

// LeakedGuards is how many Executions and CreationPermits of this process
// were garbage-collected without being completed, registered or closed, and
// had their units returned by the collector.
func (p *Pool) LeakedGuards() uint64 { return p.leakedGuards.Load() }
