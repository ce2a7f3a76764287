package orbitpool

import (
	"cmp"
	"fmt"
	"sync/atomic"
	"time"
)

// seenReservation remembers when the owner first saw a pending reservation,
// so that Reconcile ages it by the owner's own clock.
type seenReservation struct {
	ticket uint64
	gen    uint64
	since  int64
	orphan bool // a set bit without a ticket, or a stray claim (see strayClaim)
}

// Reconcile does the owner's housekeeping; the pool's dispatcher runs it every
// ReconcileInterval, and a caller may run it sooner (for example when a peer's
// connection drops). It reclaims the lanes of processes the kernel says are
// dead, and drops reservations on this process's resources that were never
// accepted: those older than ReservationTimeout, and at once those taken by a
// process that has died. It reports the first error met; a corrupt entry is
// skipped, never trusted.
func (p *Pool) Reconcile() error {
	if p.closed.Load() {
		return ErrClosed
	}
	p.reconcileMu.Lock()
	defer p.reconcileMu.Unlock()
	// Again under the lock, which Close holds while it releases the lane:
	// a Reconcile that waited for it must not heal or age a lane that may
	// be another process's by now.
	if p.closed.Load() {
		return ErrClosed
	}
	p.guards.Store(nil) // see guardBatch
	s := p.seg
	atomic.StoreUint64(s.u64(s.laneOff(p.lane)+lnHeartbeat), uint64(time.Now().UnixNano()))
	err := cmp.Or(p.healOwnLane(), p.reclaimDead())
	now := time.Now().UnixNano()
	timeout := p.opts.ReservationTimeout.Nanoseconds()
	for slot := range p.l.perLane {
		off := s.slotOff(p.lane, slot)
		if wState(atomic.LoadUint64(s.u64(off+slWord))) != StateLive {
			continue
		}
		for b := range PendingReservations {
			p.reconcileBit(off, slot, b, now, timeout)
		}
	}
	return err
}

// healOwnLane restores this process's lane record if something overwrote it:
// a lane that siblings take for free hides its resources from them and from
// every recount. The kernel's lock says the lane is ours; the record is put
// back and the keys recounted with it.
func (p *Pool) healOwnLane() error {
	s := p.seg
	ctl := s.u64(s.laneOff(p.lane) + lnCtl)
	want := laneCtl(p.laneGen, laneLive)
	if atomic.LoadUint64(ctl) == want {
		return nil
	}
	if err := s.lockStructure(); err != nil {
		return err
	}
	defer s.unlockStructure()
	got := atomic.LoadUint64(ctl)
	if got == want {
		return nil
	}
	atomic.StoreUint64(ctl, want)
	p.recount(nil)
	return fmt.Errorf("orbitpool: lane %d's record read %#x, not this process's %#x; restored: %w", p.lane, got, want, ErrCorrupt)
}

// reconcileBit judges one pending bit of this lane's slot at off. The ticket
// is read first and the word after it, so the verdict is never taken on a
// word older than the ticket: a bit set after the word was read cannot be
// mistaken for a clear one.
func (p *Pool) reconcileBit(off, slot, b int, now, timeout int64) {
	s := p.seg
	word, tp := s.u64(off+slWord), s.u64(off+slTickets+8*b)
	bit := uint64(1) << b
	t := atomic.LoadUint64(tp)
	w := atomic.LoadUint64(word)
	rec := &p.seen[slot*PendingReservations+b]
	if wState(w) != StateLive {
		*rec = seenReservation{}
		return
	}
	switch {
	case t == 0 && w&bit == 0:
		*rec = seenReservation{}
	case t == 0 || isClaim(t) && p.strayClaim(t):
		// A set bit whose ticket is gone: only Reconcile's own steps
		// pass through this state, so a bit that stays so for a whole
		// reservation timeout (a corrupt word) belongs to a reservation
		// nobody can accept, and would hold a unit forever. So would a
		// claim of this process that none of its steps holds, and hold
		// the bit's ticket too.
		if !rec.orphan || rec.ticket != t || rec.gen != wGen(w) {
			*rec = seenReservation{ticket: t, gen: wGen(w), since: now, orphan: true}
			return
		}
		if now-rec.since >= timeout {
			// The ticket and the word were read one after the other:
			// the claim of the ticket read makes the bit cleared the
			// orphan's, not that of a reservation that stamped the
			// ticket and set the bit between the two reads.
			if p.dropClaimed(off, b, t, wGen(w)) {
				p.aged(off)
			}
			*rec = seenReservation{}
		}
	case isClaim(t):
		// An Accept or a withdrawal between its two steps. A live claimer
		// finishes it, however long it is held up; one whose life ended
		// left the bit, if still set, a unit nobody will use.
		*rec = seenReservation{}
		if p.reserverAlive(t) {
			return
		}
		if p.dropReservation(off, wGen(w), bit) {
			p.aged(off)
		}
		atomic.CompareAndSwapUint64(tp, t, 0)
	case w&bit == 0:
		// A ticket stamped by a reserver that has not set its bit. If that
		// reserver's life is over, free the ticket. Take the bit first, so
		// that neither a reserver that set it unseen nor a new one can
		// hold it across the ticket's removal; then give it back. Only
		// while there is room for it, so that no one ever sees a slot
		// over its capacity; a full slot is looked at again next time.
		capacity := s.capacity(off)
		if p.reserverAlive(t) || wUse(w)+wPendN(w) >= capacity || !atomic.CompareAndSwapUint64(word, w, w|bit) {
			return
		}
		atomic.CompareAndSwapUint64(tp, t, 0)
		p.dropReservation(off, wGen(w), bit)
	default:
		if rec.orphan || rec.ticket != t || rec.gen != wGen(w) {
			*rec = seenReservation{ticket: t, gen: wGen(w), since: now}
		}
		if now-rec.since < timeout && p.reserverAlive(t) {
			return
		}
		if p.dropClaimed(off, b, t, wGen(w)) {
			p.aged(off)
		}
		*rec = seenReservation{}
	}
}

// aged gives back the unit of an unaccepted reservation that Reconcile
// dropped from this lane's slot at off.
func (p *Pool) aged(off int) {
	if k, _, ok := p.slotKey(off); ok {
		p.seg.count(p.lane, k, stAged, 1)
		p.setRoom(p.lane, k, false) // room this process's users know nothing of
		p.wake(k, 1)
	}
}

// dropClaimed drops the reservation on bit of the slot at off whose ticket
// is ticket (0: an orphan bit) in slot life gen, under a claim of the
// ticket: no Accept can take it meanwhile, nor a new reservation the bit.
// It reports whether the bit was cleared, its unit the caller's to give
// back.
func (p *Pool) dropClaimed(off, bit int, ticket, gen uint64) bool {
	mark, ok := p.claim(off, bit, ticket)
	if !ok {
		return false
	}
	defer p.unclaim(off, bit, mark)
	return p.dropReservation(off, gen, 1<<bit)
}

// dropReservation clears one pending bit on the slot at off.
func (p *Pool) dropReservation(off int, gen, bit uint64) bool {
	word := p.seg.u64(off + slWord)
	for {
		w := atomic.LoadUint64(word)
		if wGen(w) != gen || w&bit == 0 {
			return false
		}
		if atomic.CompareAndSwapUint64(word, w, w&^bit) {
			return true
		}
	}
}

// reserverAlive reports whether the lane life that took a reservation is still
// the one in its lane.
func (p *Pool) reserverAlive(t uint64) bool {
	l := ticketLane(t)
	if l >= p.l.nlanes {
		return false
	}
	c := atomic.LoadUint64(p.seg.u64(p.seg.laneOff(l) + lnCtl))
	return lnState(c) == laneLive && lnGen(c)&0xffffff == ticketLaneGen(t)
}

// reclaimDead asks the kernel about every other live lane and reclaims those
// whose process is gone.
func (p *Pool) reclaimDead() error {
	s := p.seg
	var first error
	for l := range p.l.nlanes {
		if l == p.lane || lnState(atomic.LoadUint64(s.u64(s.laneOff(l)+lnCtl))) != laneLive {
			continue
		}
		alive, err := s.laneAlive(l)
		if err != nil {
			first = cmp.Or(first, err)
			continue
		}
		if alive {
			continue
		}
		if err := s.lockStructure(); err != nil {
			first = cmp.Or(first, err)
			continue
		}
		// Another survivor may have reclaimed it, or a new process joined it,
		// while we waited for the lock.
		if lnState(atomic.LoadUint64(s.u64(s.laneOff(l)+lnCtl))) == laneLive {
			if alive, err := s.laneAlive(l); err == nil && !alive {
				info := p.laneInfo(l)
				for i := range p.l.perLane {
					if off := s.slotOff(l, i); wState(atomic.LoadUint64(s.u64(off+slWord))) == StateLive && !p.isHeld(off) {
						info.Resources++
					}
				}
				p.reclaimLane(l)
				p.finishDeadSteps()
				if p.opts.OnReclaim != nil {
					p.opts.OnReclaim(info)
				}
			}
		}
		s.unlockStructure()
	}
	return first
}
