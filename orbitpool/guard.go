package orbitpool

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
)

// Guard states: a guard is handed out held, and its first Complete, Close or
// Register makes it done. Nothing ever makes a done guard held again.
const (
	guardHeld = 1
	guardDone = 2
)

// Execution is the owner's guard over one unit of a resource in use.
// Complete (or Close) gives the unit back and wakes the key's waiters; it is
// the only way capacity returns. An Execution that is garbage-collected
// without Complete gives its unit back then, counts in LeakedGuards and is
// reported to Options.OnError: a caller's bug costs a log line rather than
// capacity for the life of the process. That is a safety net, not a way to
// release: the unit stays taken until the collector finds the guard.
type Execution struct{ g *useGuard }

// useGuard is what an Execution stands for. It lives apart from the
// Execution so that a cleanup can read it once the Execution is unreachable.
type useGuard struct {
	p     *Pool
	id    ResourceID
	key   keyRef
	state atomic.Uint32
}

// Executions are carved out of batches, with one cleanup per batch: a
// cleanup per guard would cost several times the Reserve→Accept→Complete
// cycle it guards. A batch's cleanup runs once none of its Executions is
// reachable, and returns the units of those never completed. Batches are
// handed out through a sync.Pool, which drops them at garbage collection, so
// a partly used batch does not keep a leaked guard alive for long.
const guardBatchSize = 64

type guardBatch struct {
	execs  [guardBatchSize]Execution
	guards *[guardBatchSize]useGuard
	next   int
}

var guardBatches sync.Pool

func newGuardBatch() *guardBatch {
	b := &guardBatch{guards: new([guardBatchSize]useGuard)}
	for i := range b.execs {
		b.execs[i].g = &b.guards[i]
	}
	runtime.AddCleanup(b, returnLeakedUses, b.guards)
	return b
}

func (p *Pool) newExecution(id ResourceID, ref keyRef) *Execution {
	b, _ := guardBatches.Get().(*guardBatch)
	if b == nil || b.next == guardBatchSize {
		b = newGuardBatch()
	}
	e := &b.execs[b.next]
	b.next++
	guardBatches.Put(b)
	g := e.g
	g.p, g.id, g.key = p, id, ref
	g.state.Store(guardHeld)
	return e
}

func returnLeakedUses(gs *[guardBatchSize]useGuard) {
	for i := range gs {
		g := &gs[i]
		if g.state.Load() == guardHeld && g.state.CompareAndSwap(guardHeld, guardDone) && !g.p.closed.Load() {
			g.complete()
			g.p.leaked(fmt.Errorf("orbitpool: an Execution on resource %v was garbage-collected without Complete; its unit is returned: %w", g.id, ErrLeakedGuard))
		}
	}
}

// ID is the resource in use.
func (e *Execution) ID() ResourceID { return e.g.id }

// Complete ends the use. Calls after the first do nothing, as does a Complete
// on a resource that was unregistered meanwhile.
func (e *Execution) Complete() {
	if e.g.state.CompareAndSwap(guardHeld, guardDone) {
		e.g.complete()
	}
}

// Close is Complete, for use with defer and io.Closer.
func (e *Execution) Close() error {
	e.Complete()
	return nil
}

func (g *useGuard) complete() {
	p := g.p
	if p.closed.Load() {
		return
	}
	s := p.seg
	word := s.u64(s.slotOff(p.lane, g.id.Slot()) + slWord)
	for {
		w := atomic.LoadUint64(word)
		if wGen(w) != g.id.Generation() || wState(w) != StateLive || wUse(w) == 0 {
			return
		}
		if atomic.CompareAndSwapUint64(word, w, w-useOne) {
			break
		}
	}
	p.wake(g.key.idx, 1)
}

// CreationPermit is one unit of a key's creation budget, held while a resource
// is being made. Register turns it into a live resource; Close without
// registering gives the unit back. Exactly one of them takes effect. A permit
// garbage-collected without either gives its unit back then, like an
// Execution.
type CreationPermit struct{ *permitState }

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
	cp := &CreationPermit{st}
	runtime.AddCleanup(cp, returnLeakedPermit, st)
	return cp
}

func returnLeakedPermit(st *permitState) {
	cp := &CreationPermit{st}
	if st.p.closed.Load() || !cp.take() {
		return
	}
	if err := cp.release(); err != nil {
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
