package orbitpool

import (
	"errors"
	"fmt"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"
)

// ClaimCreate takes one unit of key's creation budget: it succeeds only if the
// key's live and in-progress resources across the fleet stay within
// lim.MaxResources and its in-progress ones within lim.MaxCreating. The
// returned permit holds a slot in this process's lane.
func (p *Pool) ClaimCreate(key Key, lim Limits) (*CreationPermit, error) {
	if p.closed.Load() {
		return nil, ErrClosed
	}
	for range maxKeyRetries {
		ref, err := p.internKey(key)
		if err != nil {
			return nil, err
		}
		cp, err := p.claimCreate(ref, lim, false, -1)
		if err != errKeyGone {
			return cp, err
		}
	}
	return nil, errKeyChurn(key)
}

// Every operation that changes a key's counters and a slot together holds
// the structure lock shared, so that reclaiming a dead lane, which holds it
// exclusively and recounts the keys from the slots, never sees half of one.

func (p *Pool) claimCreate(ref keyRef, lim Limits, force bool, seenLive int) (*CreationPermit, error) {
	s := p.seg
	if err := p.rlockOpen(); err != nil {
		return nil, err
	}
	defer s.runlockStructure()
	if err := p.keyClaim(ref, lim, force, seenLive); err != nil {
		return nil, err
	}
	p.laneMu.Lock()
	if len(p.free) == 0 {
		p.laneMu.Unlock()
		// Marked as returning until the waiters are woken, for a recount
		// to wake them if this process dies in between (see slReturning).
		ret := s.u32(s.returningOff(p.lane, ref.idx))
		atomic.AddUint32(ret, 1)
		p.keyRelease(ref.idx, ref.gen, true)
		p.wake(ref.idx, 1)
		atomic.AddUint32(ret, ^uint32(0))
		return nil, fmt.Errorf("orbitpool: all %d resource slots of lane %d are in use: %w", p.l.perLane, p.lane, ErrFull)
	}
	slot, gen := p.takeFreeSlot(ref, StateCreating)
	p.laneMu.Unlock()
	return p.newPermit(slot, gen, ref), nil
}

// takeFreeSlot starts the next life of a slot off this lane's free list, for
// ref, with no capacity and no creation time (see isHeld), in state st.
// laneMu is held and the free list is not empty.
func (p *Pool) takeFreeSlot(ref keyRef, st State) (slot int, gen uint64) {
	s := p.seg
	slot = int(p.free[len(p.free)-1])
	p.free = p.free[:len(p.free)-1]
	off := s.slotOff(p.lane, slot)
	w := atomic.LoadUint64(s.u64(off + slWord))
	if w&slReturning != 0 {
		// The goroutine that freed it has not yet woken the waiters
		// for its unit: its mark moves to the lane's count for the key,
		// before the slot's word is overwritten. Counted first, then
		// cleared, and uncounted if that goroutine cleared it first:
		// returned takes from the count only a mark this cleared, so the
		// count never goes below zero, whenever either is killed.
		if k, _, ok := p.slotKey(off); ok {
			ret := s.u32(s.returningOff(p.lane, k))
			atomic.AddUint32(ret, 1)
			if !atomic.CompareAndSwapUint64(s.u64(off+slWord), w, w&^slReturning) {
				atomic.AddUint32(ret, ^uint32(0))
			}
		}
	}
	gen = wGen(w)
	if gen == 0 {
		gen = 1
	}
	atomic.StoreUint64(s.u64(off+slMeta), uint64(ref.gen)<<32|uint64(ref.idx))
	atomic.StoreUint32(s.u32(off+slCapacity), 0)
	atomic.StoreUint64(s.u64(off+slCreated), 0)
	atomic.StoreUint64(s.u64(off+slWord), slotWord(gen, st, 0, 0))
	return slot, gen
}

// Register publishes the resource the permit was held for, with room for
// capacity concurrent users, and wakes waiters on its key.
func (cp *CreationPermit) Register(capacity int) (ResourceID, error) {
	return cp.register(capacity, 0)
}

// RegisterAndAccept publishes the resource with its creator already using one
// unit of it, so no waiter can take the resource its creator made for itself.
func (cp *CreationPermit) RegisterAndAccept(capacity int) (*Execution, error) {
	id, err := cp.register(capacity, 1)
	if err != nil {
		return nil, err
	}
	return cp.p.newExecution(id, cp.key.idx), nil
}

func (cp *CreationPermit) register(capacity, use int) (ResourceID, error) {
	if capacity < 1 || capacity > MaxCapacity {
		return 0, fmt.Errorf("orbitpool: capacity %d out of range [1, %d]", capacity, MaxCapacity)
	}
	p := cp.p
	if !cp.take() {
		return 0, errors.New("orbitpool: creation permit already used")
	}
	s := p.seg
	off := s.slotOff(p.lane, cp.slot)
	if err := p.rlockOpen(); err != nil {
		cp.untake()
		return 0, err
	}
	defer s.runlockStructure()
	p.laneMu.Lock()
	atomic.StoreUint32(s.u32(off+slCapacity), uint32(capacity))
	atomic.StoreUint64(s.u64(off+slCreated), uint64(time.Now().UnixNano()))
	head := s.u32(s.headOff(p.lane, cp.key.idx))
	atomic.StoreUint32(s.u32(off+slNext), atomic.LoadUint32(head))
	ok := atomic.CompareAndSwapUint64(s.u64(off+slWord), slotWord(cp.gen, StateCreating, 0, 0), slotWord(cp.gen, StateLive, use, 0))
	if ok {
		atomic.StoreUint32(head, uint32(cp.slot)+1)
	}
	p.laneMu.Unlock()
	if !ok {
		return 0, fmt.Errorf("orbitpool: creation permit's slot was reclaimed: %w", ErrStale)
	}
	// Room before the budget: an Acquire that reads the creation as done
	// must find the resource (see try).
	if capacity > use {
		p.setRoom(p.lane, cp.key.idx, true)
	}
	p.keyCreated(cp.key.idx, cp.key.gen)
	s.count(p.lane, cp.key.idx, stCreated, 1)
	// The new capacity, plus the concurrent-creation unit it no longer holds.
	p.wake(cp.key.idx, uint64(capacity-use)+1)
	return makeID(p.lane, cp.slot, cp.gen), nil
}

// Close gives the permit's budget back unless Register already used it. It
// is safe to call more than once.
func (cp *CreationPermit) Close() error {
	if !cp.take() {
		return nil
	}
	return cp.release(-1)
}

// CloseToward is Close for a permit given up so that lane, which waits for
// the key while holding fewer of its resources (see Neediest), creates the
// resource instead: the unit goes to that lane's oldest waiter rather than
// the fleet's, as UnregisterToward's does. Where a resource is created
// settles which process owns it, and so which process's requests reach it
// without a relay.
func (cp *CreationPermit) CloseToward(lane int) error {
	if !cp.take() {
		return nil
	}
	return cp.release(lane)
}

// release frees the permit's slot and budget, its unit going to lane prefer
// within the order window (-1: in strict order); the permit is taken.
func (cp *CreationPermit) release(prefer int) error {
	p := cp.p
	s := p.seg
	off := s.slotOff(p.lane, cp.slot)
	if err := p.rlockOpen(); err != nil {
		if errors.Is(err, ErrClosed) {
			return nil // leaving the fleet released the slot and its budget
		}
		cp.untake()
		return err
	}
	defer s.runlockStructure()
	p.laneMu.Lock()
	freed := slotWord(nextGen(cp.gen), StateFree, 0, 0)
	ok := atomic.CompareAndSwapUint64(s.u64(off+slWord), slotWord(cp.gen, StateCreating, 0, 0), freed|slReturning)
	if ok {
		p.free = append(p.free, int32(cp.slot))
	}
	p.laneMu.Unlock()
	if ok {
		p.keyRelease(cp.key.idx, cp.key.gen, true)
		p.wakeToward(cp.key.idx, 1, prefer)
		p.returned(off, freed, cp.key.idx)
	}
	return nil
}

// Register publishes a resource this process owns under key with room for
// capacity concurrent users. It counts against the key's fleet-wide total but
// is not refused by any budget: the resource exists already.
func (p *Pool) Register(key Key, capacity int) (ResourceID, error) {
	if p.closed.Load() {
		return 0, ErrClosed
	}
	for range maxKeyRetries {
		ref, err := p.internKey(key)
		if err != nil {
			return 0, err
		}
		cp, err := p.claimCreate(ref, Limits{}, true, -1)
		if err == errKeyGone {
			continue
		}
		if err != nil {
			return 0, err
		}
		id, err := cp.Register(capacity)
		if err != nil {
			cp.Close()
		}
		return id, err
	}
	return 0, errKeyChurn(key)
}

// ownSlot checks that id names a slot of this process's lane.
func (p *Pool) ownSlot(id ResourceID) (int, error) {
	if p.closed.Load() {
		return 0, ErrClosed
	}
	if id.Lane() != p.lane {
		return 0, fmt.Errorf("orbitpool: resource %v: %w", id, ErrNotOwner)
	}
	if id.Slot() >= p.l.perLane {
		return 0, fmt.Errorf("orbitpool: resource %v: slot out of range: %w", id, ErrStale)
	}
	return p.seg.slotOff(p.lane, id.Slot()), nil
}

// Unregister removes a resource this process owns, for instance a connection
// that closed. Reservations on it become stale at once and executions on it
// complete as no-ops; the key's budget gets the unit back.
func (p *Pool) Unregister(id ResourceID) error { return p.unregister(id, -1) }

// UnregisterToward is Unregister for a resource that leaves so that lane,
// which holds fewer of the key's resources (see Neediest), creates the next
// one: the unit goes to that lane's oldest waiter rather than the fleet's,
// when it is at most Options.OrderWindow tickets younger, and in strict order
// otherwise.
func (p *Pool) UnregisterToward(id ResourceID, lane int) error { return p.unregister(id, lane) }

func (p *Pool) unregister(id ResourceID, prefer int) error {
	off, err := p.ownSlot(id)
	if err != nil {
		return err
	}
	s := p.seg
	if err := p.rlockOpen(); err != nil {
		return err
	}
	defer s.runlockStructure()
	p.laneMu.Lock()
	var w, freed uint64
	for {
		w = atomic.LoadUint64(s.u64(off + slWord))
		if wGen(w) != id.Generation() || wState(w) != StateLive {
			p.laneMu.Unlock()
			return fmt.Errorf("orbitpool: unregister %v: %w", id, ErrStale)
		}
		// Freed and marked as returning its unit, until the waiters are
		// woken (see slReturning).
		freed = slotWord(nextGen(wGen(w)), StateFree, 0, 0)
		if atomic.CompareAndSwapUint64(s.u64(off+slWord), w, freed|slReturning) {
			break
		}
	}
	for b := range PendingReservations {
		atomic.StoreUint64(s.u64(off+slTickets+8*b), 0)
	}
	k, kg, ok := p.slotKey(off)
	if ok {
		p.unlink(k, id.Slot())
	}
	p.free = append(p.free, int32(id.Slot()))
	p.laneMu.Unlock()
	if !ok {
		p.returned(off, freed, k)
		return fmt.Errorf("orbitpool: resource %v names key entry %d of %d: %w", id, k, p.l.nkeys, ErrCorrupt)
	}
	p.keyRelease(k, kg, false)
	p.wakeToward(k, 1, prefer)
	p.returned(off, freed, k)
	return nil
}

// returned clears the returning mark that freeing the slot at off (to the
// word freed) set, once the waiters of key entry k have been woken for the
// unit. If the slot was taken again for a creation meanwhile, the mark was
// moved to the lane's returning count for k (see claimCreate), which is
// decremented instead.
func (p *Pool) returned(off int, freed uint64, k int) {
	s := p.seg
	if atomic.CompareAndSwapUint64(s.u64(off+slWord), freed|slReturning, freed) || k >= p.l.nkeys {
		return
	}
	atomic.AddUint32(s.u32(s.returningOff(p.lane, k)), ^uint32(0))
}

// unlink removes slot from this lane's list for key k. laneMu is held.
// Readers walking the list concurrently may still step onto the removed slot;
// they check each slot's key and state, so they only ever skip it.
func (p *Pool) unlink(k, slot int) {
	s := p.seg
	prev := s.u32(s.headOff(p.lane, k))
	for steps := 0; steps <= p.l.perLane; steps++ {
		cur := atomic.LoadUint32(prev)
		if cur == 0 || int(cur) > p.l.perLane {
			return
		}
		next := s.u32(s.slotOff(p.lane, int(cur)-1) + slNext)
		if int(cur)-1 == slot {
			atomic.StoreUint32(prev, atomic.LoadUint32(next))
			return
		}
		prev = next
	}
}

// Reserve takes one unit of capacity on a resource and returns the lease to
// present to its owner. Whether there is room is decided by one
// compare-and-swap on the slot word. ErrBusy means no room; ErrStale means the
// resource is gone.
func (p *Pool) Reserve(id ResourceID) (Lease, error) {
	if p.closed.Load() {
		return Lease{}, ErrClosed
	}
	lane, slot := id.Lane(), id.Slot()
	if lane >= p.l.nlanes || slot >= p.l.perLane {
		return Lease{}, fmt.Errorf("orbitpool: reserve %v: no such slot: %w", id, ErrStale)
	}
	s := p.seg
	off := s.slotOff(lane, slot)
	word := s.u64(off + slWord)
	capacity := s.capacity(off)
	grantHook(id)
	// Stamp a free ticket first, so that a pending bit always carries the
	// ticket of the reservation that set it: the owner can then age each
	// reservation by its own identity. Only the holder of a stamped ticket
	// sets the matching bit.
	t := p.newTicket()
	for range PendingReservations {
		w := atomic.LoadUint64(word)
		if err := reservable(w, id, capacity); err != nil {
			return Lease{}, err
		}
		bit := -1
		for free := ^wPend(w) & pendMask; free != 0; free &= free - 1 {
			b := bits.TrailingZeros64(free)
			if atomic.CompareAndSwapUint64(s.u64(off+slTickets+8*b), 0, t) {
				bit = b
				break
			}
		}
		if bit < 0 {
			return Lease{}, ErrBusy // every free bit is being taken right now
		}
		for {
			if w&(1<<bit) != 0 {
				// Our view was older than the bit's last use, whose owner
				// is still clearing it: give the ticket back, start over.
				atomic.CompareAndSwapUint64(s.u64(off+slTickets+8*bit), t, 0)
				break
			}
			if atomic.CompareAndSwapUint64(word, w, w|1<<bit) {
				if p.overCapacity(off, w|1<<bit) {
					p.ungrant(off, id, bit, t)
					return Lease{}, ErrBusy
				}
				inc := Incarnation(atomic.LoadUint64(s.u64(s.laneOff(lane) + lnIncarnation)))
				return Lease{ID: id, Owner: inc, Ticket: t, Bit: uint8(bit)}, nil
			}
			w = atomic.LoadUint64(word)
			if err := reservable(w, id, capacity); err != nil {
				atomic.CompareAndSwapUint64(s.u64(off+slTickets+8*bit), t, 0)
				return Lease{}, err
			}
		}
	}
	return Lease{}, ErrBusy
}

// reservable says whether slot word w has room for one more reservation on id.
func reservable(w uint64, id ResourceID, capacity int) error {
	if wGen(w) != id.Generation() || wState(w) != StateLive {
		return ErrStale
	}
	if pend := wPend(w); pend == pendMask || wUse(w)+bits.OnesCount64(pend) >= capacity {
		return ErrBusy
	}
	return nil
}

func (p *Pool) newTicket() uint64 {
	for {
		if n := p.tickets.Add(1) &^ claimFlag; n != 0 {
			return makeTicket(p.lane, p.laneGen, n)
		}
	}
}

// claim takes the ticket of the reservation on bit of the slot at off: the
// first step of its Accept or withdrawal, which makes that one the only one.
// It leaves a claim of this process in the ticket's place until unclaim, so
// that while the bit is turned into a use or cleared no new reservation can
// stamp the ticket and take the bit, and Reconcile leaves the bit alone. Were
// the ticket cleared instead, a claimer stalled past ReservationTimeout
// between the two steps would find its bit aged out and taken by a new
// reservation, and act on that one. Reconcile finishes only the claims of a
// process whose life has ended.
func (p *Pool) claim(off, bit int, ticket uint64) (mark uint64, ok bool) {
	mark = p.newTicket() | claimFlag
	// Recorded before it can be seen in the segment, forgotten after it
	// is gone from there (see strayClaim).
	p.claiming.add(mark)
	if !atomic.CompareAndSwapUint64(p.seg.u64(off+slTickets+8*bit), ticket, mark) {
		p.claiming.remove(mark)
		return 0, false
	}
	if h := testHookClaimed.Load(); h != nil {
		(*h)()
	}
	return mark, true
}

// unclaim ends a claim: the bit's ticket is free again.
func (p *Pool) unclaim(off, bit int, mark uint64) {
	atomic.CompareAndSwapUint64(p.seg.u64(off+slTickets+8*bit), mark, 0)
	p.claiming.remove(mark)
}

// strayClaim reports whether claim mark t names this process's present life
// but none of its claims under way: a corrupt word. Claims are unique, so
// one read here after the segment showed it cannot be a later claim's.
func (p *Pool) strayClaim(t uint64) bool {
	return ticketLane(t) == p.lane && ticketLaneGen(t) == p.laneGen&0xffffff && !p.claiming.has(t)
}

// claimRecord is a set of claim marks, cheap for the few a process has under
// way at once: a mark takes the word its counter names, and goes to the map
// only if an older claim still holds that word.
type claimRecord struct {
	words [64]atomic.Uint64
	mu    sync.Mutex
	more  map[uint64]struct{}
}

func (r *claimRecord) add(mark uint64) {
	if r.words[mark%uint64(len(r.words))].CompareAndSwap(0, mark) {
		return
	}
	r.mu.Lock()
	if r.more == nil {
		r.more = make(map[uint64]struct{})
	}
	r.more[mark] = struct{}{}
	r.mu.Unlock()
}

func (r *claimRecord) remove(mark uint64) {
	if r.words[mark%uint64(len(r.words))].CompareAndSwap(mark, 0) {
		return
	}
	r.mu.Lock()
	delete(r.more, mark)
	r.mu.Unlock()
}

func (r *claimRecord) has(mark uint64) bool {
	if r.words[mark%uint64(len(r.words))].Load() == mark {
		return true
	}
	r.mu.Lock()
	_, ok := r.more[mark]
	r.mu.Unlock()
	return ok
}

// Accept validates a lease presented to this process, the resource's owner,
// and turns its reservation into an Execution. A lease whose slot was freed
// or reused, whose reservation was aged out or already accepted, or that was
// taken on an earlier life of this lane, is ErrStale.
func (p *Pool) Accept(l Lease) (*Execution, error) {
	off, err := p.ownSlot(l.ID)
	if err != nil {
		return nil, err
	}
	if l.Owner != p.inc {
		return nil, fmt.Errorf("orbitpool: lease for incarnation %#x, this is %#x: %w", l.Owner, p.inc, ErrStale)
	}
	if l.Bit >= PendingReservations || l.Ticket == 0 || isClaim(l.Ticket) {
		return nil, fmt.Errorf("orbitpool: malformed lease: %w", ErrStale)
	}
	s := p.seg
	bit := uint64(1) << l.Bit
	w := atomic.LoadUint64(s.u64(off + slWord))
	if wGen(w) != l.ID.Generation() || wState(w) != StateLive || w&bit == 0 {
		return nil, ErrStale
	}
	// Taking the ticket is what makes this acceptance the only one: the bit
	// stays set until then, so no new reservation can reuse it meanwhile.
	mark, ok := p.claim(off, int(l.Bit), l.Ticket)
	if !ok {
		return nil, ErrStale
	}
	defer p.unclaim(off, int(l.Bit), mark)
	// The key is read between the word load above and the compare-and-swap
	// below, both of this generation, so it is the key of the life that
	// the use is taken on.
	k, _, ok := p.slotKey(off)
	if !ok {
		// Refused before the use is taken: the unit goes back, with no
		// wake, on a slot that cannot say whose waiters to wake.
		p.dropReservation(off, l.ID.Generation(), bit)
		return nil, fmt.Errorf("orbitpool: resource %v names key entry %d: %w", l.ID, k, ErrCorrupt)
	}
	for {
		w = atomic.LoadUint64(s.u64(off + slWord))
		if wGen(w) != l.ID.Generation() || w&bit == 0 {
			return nil, ErrStale
		}
		if atomic.CompareAndSwapUint64(s.u64(off+slWord), w, w&^bit+useOne) {
			break
		}
	}
	if p.undoIfClosed(off, l.ID.Generation(), k) {
		return nil, ErrClosed
	}
	s.count(p.lane, k, stAccepted, 1)
	return p.newExecution(l.ID, k), nil
}

// useLocal reserves and accepts a unit of one of this process's resources in a
// single compare-and-swap: no lease needs to cross a process.
func (p *Pool) useLocal(id ResourceID, ref keyRef) (*Execution, error) {
	s := p.seg
	off := s.slotOff(p.lane, id.Slot())
	capacity := s.capacity(off)
	grantHook(id)
	for {
		w := atomic.LoadUint64(s.u64(off + slWord))
		if wGen(w) != id.Generation() || wState(w) != StateLive {
			return nil, ErrStale
		}
		if wUse(w)+wPendN(w) >= capacity {
			return nil, ErrBusy
		}
		if atomic.CompareAndSwapUint64(s.u64(off+slWord), w, w+useOne) {
			if p.overCapacity(off, w+useOne) {
				p.dropUse(off, id.Generation(), ref.idx)
				return nil, ErrBusy
			}
			if p.undoIfClosed(off, id.Generation(), ref.idx) {
				return nil, ErrClosed
			}
			return p.newExecution(id, ref.idx), nil
		}
	}
}

// undoIfClosed gives back the use just taken on the slot at off, of key k in
// slot life gen, if Close has begun, and reports whether it did. Close may
// have given the lane to another process, or be about to free the slot,
// between the read of the slot and the use: Close marks the pool first, so
// seeing it unmarked after the use proves the slot was still this
// process's, and the use outlives Close's clearing of it no more than any
// other Execution does.
func (p *Pool) undoIfClosed(off int, gen uint64, k int) bool {
	if !p.closed.Load() {
		return false
	}
	p.dropUse(off, gen, k)
	return true
}

// dropUse gives back one use of the slot at off in generation gen, and
// reports whether it went to a waiter of this process.
func (p *Pool) dropUse(off int, gen uint64, k int) (handed bool) {
	word := p.seg.u64(off + slWord)
	for {
		w := atomic.LoadUint64(word)
		if wGen(w) != gen || wState(w) != StateLive || wUse(w) == 0 {
			return false
		}
		if atomic.CompareAndSwapUint64(word, w, w-useOne) {
			return p.unitBack(k)
		}
	}
}
