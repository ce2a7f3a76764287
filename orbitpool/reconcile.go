package orbitpool

import (
	"cmp"
	"sync/atomic"
	"time"
)

// seenReservation remembers when the owner first saw a pending reservation,
// so that Reconcile ages it by the owner's own clock.
type seenReservation struct {
	ticket uint64
	gen    uint64
	since  int64
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
	s := p.seg
	atomic.StoreUint64(s.u64(s.laneOff(p.lane)+lnHeartbeat), uint64(time.Now().UnixNano()))
	err := p.reclaimDead()
	now := time.Now().UnixNano()
	timeout := p.opts.ReservationTimeout.Nanoseconds()
	for slot := range p.l.perLane {
		off := s.slotOff(p.lane, slot)
		w := atomic.LoadUint64(s.u64(off + slWord))
		if wState(w) != StateLive {
			continue
		}
		for b := range PendingReservations {
			tp := s.u64(off + slTickets + 8*b)
			t := atomic.LoadUint64(tp)
			if t == 0 {
				continue
			}
			rec := &p.seen[slot*PendingReservations+b]
			if w&(1<<b) == 0 {
				// A ticket stamped by a reserver that died before it set
				// the bit (or is about to): free it once its life is over.
				if !p.reserverAlive(t) {
					atomic.CompareAndSwapUint64(tp, t, 0)
				}
				continue
			}
			if rec.ticket != t || rec.gen != wGen(w) {
				*rec = seenReservation{ticket: t, gen: wGen(w), since: now}
			}
			if now-rec.since < timeout && p.reserverAlive(t) {
				continue
			}
			if !atomic.CompareAndSwapUint64(tp, t, 0) {
				continue // accepted meanwhile
			}
			if p.dropReservation(off, wGen(w), uint64(1)<<b) {
				if k, _, ok := p.slotKey(off); ok {
					s.count(p.lane, k, stAged, 1)
					p.wake(k, 1)
				}
			}
			*rec = seenReservation{}
		}
	}
	return err
}

// dropReservation clears one pending bit on this lane's slot at off.
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
				p.reclaimLane(l)
				if p.opts.OnReclaim != nil {
					p.opts.OnReclaim(info)
				}
			}
		}
		s.unlockStructure()
	}
	return first
}
