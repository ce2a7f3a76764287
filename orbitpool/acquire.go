package orbitpool

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// Candidates appends to dst the live resources registered under key across
// the fleet, this process's first. It is a snapshot: by the time the caller
// reserves, a candidate may be busy or gone.
func (p *Pool) Candidates(key Key, dst []Candidate) ([]Candidate, error) {
	if p.closed.Load() {
		return dst, ErrClosed
	}
	ref, ok := p.lookupKey(key)
	if !ok {
		return dst, nil
	}
	return p.candidates(ref, dst)
}

func (p *Pool) candidates(ref keyRef, dst []Candidate) ([]Candidate, error) {
	dst, err := p.laneCandidates(p.lane, ref, dst)
	s := p.seg
	for l := range p.l.nlanes {
		if l == p.lane || lnState(atomic.LoadUint64(s.u64(s.laneOff(l)+lnCtl))) != laneLive {
			continue
		}
		var lerr error
		dst, lerr = p.laneCandidates(l, ref, dst)
		if err == nil {
			err = lerr
		}
	}
	return dst, err
}

// roomCandidates appends the resources of ref in the other lanes that the
// key's room mask names, at a cost that follows the lanes with room rather
// than the fleet. A lane whose bit is set but that has no room (its last unit
// was taken since) loses its bit: it is cleared, then the lane is looked at
// again, and set back if it has room after all, for an owner that gives a
// unit back sets the bit after the unit is visible.
//
// Room for the bit is a unit neither used nor reserved (withUnitRoom), even when
// all of a resource's PendingReservations are taken, so that a sibling cannot
// reserve it now: the bit is also what the owner's own uses read
// (takeLocal), and they take no reservation; and the owner gives reservation
// bits back as it accepts leases, which sets no bit. Cleared then, the bit
// would hide the owner's room from the owner, and from every sibling once
// the owner has caught up, until a unit came back.
func (p *Pool) roomCandidates(ref keyRef, dst []Candidate) ([]Candidate, error) {
	s := p.seg
	var first error
	for i := range p.l.maskWords {
		for m := atomic.LoadUint64(s.u64(s.roomOff(ref.idx, 64*i))); m != 0; m &= m - 1 {
			l := i*64 + trailingZeros(m)
			if l == p.lane || l >= p.l.nlanes || lnState(atomic.LoadUint64(s.u64(s.laneOff(l)+lnCtl))) != laneLive {
				continue
			}
			n := len(dst)
			var err error
			p.checkRoom(l, ref.idx, func() bool {
				dst, err = p.laneCandidates(l, ref, dst[:n])
				return err != nil || withUnitRoom(dst[n:])
			})
			if err != nil && first == nil {
				first = err
			}
		}
	}
	return dst, first
}

// withUnitRoom reports whether one of cs has a unit neither used nor
// reserved.
func withUnitRoom(cs []Candidate) bool {
	for _, c := range cs {
		if c.Capacity-c.InUse-c.Pending > 0 {
			return true
		}
	}
	return false
}

// laneCandidates walks lane l's list for ref. The list is written by its owner
// only; a reader racing with a removal may step onto a slot that now belongs
// to another key, so every slot's key is checked and the walk is bounded.
func (p *Pool) laneCandidates(l int, ref keyRef, dst []Candidate) ([]Candidate, error) {
	s := p.seg
	h := atomic.LoadUint32(s.u32(s.headOff(l, ref.idx)))
	for steps := 0; h != 0 && steps < p.l.perLane; steps++ {
		if int(h) > p.l.perLane {
			return dst, fmt.Errorf("orbitpool: lane %d list for key entry %d points at slot %d of %d: %w", l, ref.idx, h-1, p.l.perLane, ErrCorrupt)
		}
		slot := int(h) - 1
		off := s.slotOff(l, slot)
		if w, capacity, ok := p.liveSlotOf(off, ref); ok {
			dst = append(dst, Candidate{
				ID:       makeID(l, slot, wGen(w)),
				Lane:     l,
				Local:    l == p.lane,
				Capacity: capacity,
				InUse:    wUse(w),
				Pending:  wPendN(w),
				State:    StateLive,
			})
		}
		h = atomic.LoadUint32(s.u32(off + slNext))
	}
	return dst, nil
}

// liveSlotOf reads the slot at off as one life: its word, capacity and key.
// It reports ok only for a live slot of ref. A slot's key and capacity are
// written while it is free or being created, before the generation it goes
// live with; so a live word of one generation read before and after them
// proves they are that life's, and an operation that then requires that
// generation in its compare-and-swap acts on ref's resource and no other.
func (p *Pool) liveSlotOf(off int, ref keyRef) (w uint64, capacity int, ok bool) {
	s := p.seg
	w = atomic.LoadUint64(s.u64(off + slWord))
	if wState(w) != StateLive {
		return 0, 0, false
	}
	k, kg, _ := p.slotKey(off)
	capacity = s.capacity(off)
	w2 := atomic.LoadUint64(s.u64(off + slWord))
	if k != ref.idx || kg != ref.gen || wGen(w2) != wGen(w) || wState(w2) != StateLive {
		return 0, 0, false
	}
	return w2, capacity, true
}

// PlanKind says what an acquisition committed to.
type PlanKind uint8

// Plan kinds.
const (
	// PlanReuseLocal: Plan.Execution is a unit of a resource this process
	// owns, already accepted.
	PlanReuseLocal PlanKind = iota + 1
	// PlanReuseRemote: Plan.Lease is a reservation on a sibling's resource,
	// to be presented to its owner.
	PlanReuseRemote
	// PlanCreate: Plan.Permit is creation budget already claimed.
	PlanCreate
)

func (k PlanKind) String() string {
	switch k {
	case PlanReuseLocal:
		return "reuse-local"
	case PlanReuseRemote:
		return "reuse-remote"
	case PlanCreate:
		return "create"
	}
	return "none"
}

// Plan is what Acquire committed to. None of it is advisory: a reuse plan holds
// a reservation and a create plan holds budget, which the caller must give
// back (Execution.Complete, presenting the lease to its owner, or
// CreationPermit.Register/Close).
type Plan struct {
	Kind      PlanKind
	Execution *Execution
	Lease     Lease
	Permit    *CreationPermit
	// Waited is how long the acquisition was parked.
	Waited time.Duration
}

// WaitError is returned when an acquisition's context ends while it waits.
type WaitError struct {
	Key    Key
	Reason Reason        // why nothing could be had
	Waited time.Duration // how long it waited
	Err    error         // the context's cause
}

func (e *WaitError) Error() string {
	return fmt.Sprintf("orbitpool: no capacity for key %v (%s) after waiting %v: %v", e.Key, e.Reason, e.Waited.Round(time.Microsecond), e.Err)
}

func (e *WaitError) Unwrap() error { return e.Err }

// RefusedError is returned when the policy refuses a request.
type RefusedError struct{ Reason Reason }

func (e *RefusedError) Error() string { return "orbitpool: refused by policy: " + e.Reason.String() }

// Is makes a RefusedError match ErrRefused.
func (e *RefusedError) Is(target error) bool { return target == ErrRefused }

// scratch is Acquire's reusable working memory: the candidate list and the
// view handed to the policy (which would escape to the heap through the
// interface call otherwise).
type scratch struct {
	cands []Candidate
	view  View
}

var scratches = sync.Pool{New: func() any { return &scratch{cands: make([]Candidate, 0, 64)} }}

// errWait is try's signal that the policy chose to wait.
var errWait = errors.New("orbitpool: wait")

// Acquire gets capacity for key under policy (LocalFirst if nil) and lim: it
// reuses a resource, or claims creation budget, or parks on the key until
// capacity returns anywhere in the fleet and tries again, until ctx ends.
// A caller that needs to fail before its deadline passes a context whose
// deadline is that much earlier.
//
// Waiters are served in the order they arrived, across the fleet: each takes
// a ticket from the key's counter, a unit of capacity that comes back is
// handed to the oldest waiter of any process, and while any process has a
// waiter on the key a newcomer queues behind it rather than take what came
// back.
func (p *Pool) Acquire(ctx context.Context, key Key, policy Policy, lim Limits) (plan Plan, err error) {
	if policy == nil {
		policy = LocalFirst{}
	}
	var (
		w       *waiter
		ch      <-chan struct{}
		holding bool // w tries with a unit it was handed
		own     bool // w tries without one: it found no older waiter
		start   time.Time
		reason  Reason
		ref     keyRef
	)
	// Every way out leaves no registration behind: a waiter that is gone
	// but still queued would take the next unit meant for a live one. And
	// one that was handed a unit and then fails passes it on, for the
	// capacity it announced is still there for the next waiter.
	// And one that found its own way to capacity that nobody handed to it
	// lets the next waiter look too: waiters younger than it deferred to
	// it, and there may be more where its unit came from.
	defer func() {
		if w != nil {
			p.waiters.leave(p, w, (holding && err != nil) || (own && err == nil))
		}
	}()
	for retries := 0; ; {
		ref, err = p.internKey(key)
		if err != nil {
			return Plan{}, err
		}
		var r Reason
		own = false
		switch {
		case w == nil && p.queued(ref.idx):
			err = errWait // others wait already: take a ticket behind them
		case w != nil && !holding && !p.waiters.eligible(p, w):
			err = errWait // an older waiter is first
		default:
			own = w != nil && !holding
			plan, r, err = p.try(ref, key, policy, lim)
		}
		switch {
		case err == nil:
			if !start.IsZero() {
				plan.Waited = time.Since(start)
				p.seg.count(p.lane, ref.idx, stWaits, 1)
				p.seg.count(p.lane, ref.idx, stWaitNanos, uint64(plan.Waited))
			}
			return plan, nil
		case err == errStaleView:
			// A resource was made since try looked: look again. Each
			// time follows another process's creation finishing.
			continue
		case err == errKeyGone:
			if retries++; retries > maxKeyRetries {
				return Plan{}, errKeyChurn(key)
			}
			if w != nil { // registered on the entry's earlier life
				p.waiters.leave(p, w, holding)
				w, holding = nil, false
			}
			continue
		case err != errWait:
			return Plan{}, err
		}
		if r != ReasonNone || reason == ReasonNone {
			reason = r
		}
		if w == nil {
			// Register, then re-check before sleeping, so that capacity
			// returned in between is not missed.
			if w, err = p.waiters.register(p, ref); err != nil {
				if err == errKeyGone {
					w = nil
					continue
				}
				return Plan{}, err
			}
			ch = w.ch
			if start.IsZero() {
				start = time.Now()
			}
			continue
		}
		held := holding
		holding = false
		select {
		case <-ch:
			if ch, holding = p.waiters.take(p, w); !holding {
				// Its last try may have found nothing because the
				// pool was closing: the unit it held goes on (see
				// leave). If the room had gone, that costs a look.
				holding = held
				return Plan{}, ErrClosed
			}
		case <-ctx.Done():
			holding = held // as on Close
			waited := time.Since(start)
			p.seg.count(p.lane, ref.idx, stTimeouts, 1)
			p.seg.count(p.lane, ref.idx, stWaitNanos, uint64(waited))
			if reason == ReasonNone {
				reason = ReasonBusy
			}
			return Plan{}, &WaitError{Key: key, Reason: reason, Waited: waited, Err: context.Cause(ctx)}
		}
	}
}

// queued reports whether any process has a waiter on key entry k.
func (p *Pool) queued(k int) bool {
	s := p.seg
	off := s.keyOff(k) + kfMasks
	if p.l.maskWords == 1 {
		return atomic.LoadUint64(s.u64(off)) != 0
	}
	for i := range p.l.maskWords {
		if atomic.LoadUint64(s.u64(off+8*i)) != 0 {
			return true
		}
	}
	return false
}

// try runs the policy once over a fresh view, taking what it decides.
func (p *Pool) try(ref keyRef, key Key, policy Policy, lim Limits) (Plan, Reason, error) {
	if p.closed.Load() {
		return Plan{}, ReasonNone, ErrClosed
	}
	builtin, remote := false, false
	switch policy.(type) {
	case LocalFirst, LocalOnly, CreateBeforeRemote:
		// All start with the least loaded local resource with room; find
		// it without building the fleet's candidate list.
		if plan, ok, err := p.tryLocal(ref); ok || err != nil {
			return plan, ReasonNone, err
		}
		builtin = true
		_, local := policy.(LocalOnly)
		remote = !local
	}
	sc := scratches.Get().(*scratch)
	defer scratches.Put(sc)
	sc.view = View{Key: key, Limits: lim}
	v := &sc.view
	// The budget before the candidates: a resource is live in its list,
	// with its lane's room bit set, before its creation leaves the budget,
	// so a creation that completes between the two reads shows in the
	// candidates, and the policy never sees neither (and creates again
	// under MaxCreating 1). One that completes after both reads makes the
	// creation claim fail as stale, and try is run again. A local one may
	// have completed since takeLocal looked, so the built-in policies look
	// once more.
	p.readBudget(ref, v)
	// The candidates are as of this reading: a claim made after the budget
	// is read again below still compares the live count with it, for a
	// creation that completes in between is not among them.
	seenLive := v.Total - v.Creating
	if builtin {
		if plan, ok, err := p.tryLocal(ref); ok || err != nil {
			return plan, ReasonNone, err
		}
	}
	cands, err := sc.cands[:0], error(nil)
	switch {
	case !builtin:
		cands, err = p.candidates(ref, cands)
	case remote:
		// LocalFirst and CreateBeforeRemote may want a sibling's resource
		// with room, and look only in the lanes the key's room mask names;
		// LocalOnly wants none.
		cands, err = p.roomCandidates(ref, cands)
	}
	sc.cands = cands[:0]
	if err != nil {
		return Plan{}, ReasonNone, err
	}
	v.Candidates = cands
	for range 2*len(cands) + 2 {
		d := policy.Decide(v)
		switch d.Action {
		case ActionReuse:
			if d.Candidate < 0 || d.Candidate >= len(cands) {
				return Plan{}, ReasonNone, fmt.Errorf("orbitpool: policy chose candidate %d of %d", d.Candidate, len(cands))
			}
			c := &cands[d.Candidate]
			if c.Local {
				e, err := p.useLocal(c.ID, ref)
				if err == nil {
					p.seg.count(p.lane, ref.idx, stReusedLocal, 1)
					return Plan{Kind: PlanReuseLocal, Execution: e}, ReasonNone, nil
				}
			} else {
				l, err := p.Reserve(c.ID)
				if err == nil {
					p.seg.count(p.lane, ref.idx, stReusedRemote, 1)
					return Plan{Kind: PlanReuseRemote, Lease: l}, ReasonNone, nil
				}
			}
			c.InUse, c.Pending = c.Capacity, 0 // lost a race for it: full now
		case ActionCreate:
			cp, err := p.claimCreate(ref, lim, false, seenLive)
			if err == nil {
				return Plan{Kind: PlanCreate, Permit: cp}, ReasonNone, nil
			}
			if err == errStaleView {
				return Plan{}, ReasonNone, err // look again
			}
			if !errors.Is(err, ErrBudget) {
				return Plan{}, ReasonNone, err
			}
			budgetLostHook()
			p.readBudget(ref, v) // lost a race for the last unit
		case ActionWait:
			return Plan{}, d.Reason, errWait
		default:
			return Plan{}, d.Reason, &RefusedError{Reason: d.Reason}
		}
	}
	return Plan{}, ReasonBusy, errWait
}

// Live is how many resources of key are registered across the fleet now.
func (p *Pool) Live(key Key) int {
	ref, ok := p.lookupKey(key)
	if !ok {
		return 0
	}
	var v View
	p.readBudget(ref, &v)
	return v.Total - v.Creating
}

func (p *Pool) readBudget(ref keyRef, v *View) {
	c := atomic.LoadUint64(p.seg.u64(p.seg.keyOff(ref.idx) + kfCtl))
	v.Total, v.Creating = kTotal(c), kCreating(c)
}

// takeLocal uses the least loaded of this lane's resources for ref that has
// room, stopping at the first idle one. The lane's bit in the key's room mask
// spares the walk when it is clear, and is cleared as roomCandidates does
// when the walk finds nothing.
func (p *Pool) takeLocal(ref keyRef) (*Execution, error) {
	// checkRoom's protocol, written out: this is the hot path.
	word, bit := p.seg.u64(p.seg.roomOff(ref.idx, p.lane)), laneBit(p.lane)
	if atomic.LoadUint64(word)&bit == 0 {
		return nil, nil
	}
	e, room, err := p.takeLocalOnce(ref)
	if room || err != nil {
		return e, err
	}
	atomic.AndUint64(word, ^bit)
	if e, room, err = p.takeLocalOnce(ref); room {
		atomic.OrUint64(word, bit)
	}
	return e, err
}

// tryLocal is takeLocal as a plan: ok when it took a local resource.
func (p *Pool) tryLocal(ref keyRef) (Plan, bool, error) {
	e, err := p.takeLocal(ref)
	if e == nil || err != nil {
		return Plan{}, false, err
	}
	p.seg.count(p.lane, ref.idx, stReusedLocal, 1)
	return Plan{Kind: PlanReuseLocal, Execution: e}, true, nil
}

// checkRoom runs scan over lane l's resources of key k if the key's room mask
// names l. A scan that sees no room clears the bit and runs again, and one
// that then does see room sets it back: an owner sets the bit only after the
// unit it gives back is visible, so the bit is never left clear over a
// resource with room.
func (p *Pool) checkRoom(l, k int, scan func() bool) {
	word, bit := p.seg.u64(p.seg.roomOff(k, l)), laneBit(l)
	if atomic.LoadUint64(word)&bit == 0 {
		return
	}
	if scan() {
		return
	}
	atomic.AndUint64(word, ^bit)
	if scan() {
		atomic.OrUint64(word, bit)
	}
}

// takeLocalOnce is takeLocal's walk. It reports whether it saw room, even if
// it lost the race for it.
func (p *Pool) takeLocalOnce(ref keyRef) (*Execution, bool, error) {
	s := p.seg
	room := false
	for range 4 {
		var best ResourceID
		load := -1
		h := atomic.LoadUint32(s.u32(s.headOff(p.lane, ref.idx)))
		for steps := 0; h != 0 && steps < p.l.perLane; steps++ {
			if int(h) > p.l.perLane {
				return nil, false, fmt.Errorf("orbitpool: lane %d list for key entry %d points at slot %d of %d: %w", p.lane, ref.idx, h-1, p.l.perLane, ErrCorrupt)
			}
			slot := int(h) - 1
			off := s.slotOff(p.lane, slot)
			h = atomic.LoadUint32(s.u32(off + slNext))
			w, capacity, ok := p.liveSlotOf(off, ref)
			if l := wUse(w) + wPendN(w); ok && l < capacity && (load < 0 || l < load) {
				// The generation seen with the key is the one taken.
				best, load = makeID(p.lane, slot, wGen(w)), l
				if l == 0 {
					break
				}
			}
		}
		if load < 0 {
			return nil, room, nil
		}
		room = true
		if e, err := p.useLocal(best, ref); err == nil {
			return e, true, nil
		}
	}
	return nil, room, nil
}
