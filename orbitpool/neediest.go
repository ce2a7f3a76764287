package orbitpool

import "sync/atomic"

// Neediest finds the sibling that waits for key while holding the fewest of
// its resources, for a process that holds more than its share to make room
// for (UnregisterToward). held is that lane's count and own this process's,
// counting resources with capacity, so that one already leaving is not. A
// sibling counts only if its next waiter is within Options.OrderWindow
// tickets of the fleet's oldest, as UnregisterToward requires for the unit
// to go to it. ok is false when no sibling qualifies. It walks the key's
// lists in every lane with a waiter: a cost of the key's resources, not of
// the fleet's size, for a caller that looks now and then.
func (p *Pool) Neediest(key Key) (lane, held, own int, ok bool) {
	return p.NeediestBy(key, nil)
}

// NeediestBy is Neediest with each waiting sibling's count passed through
// adjust(lane, count) before the counts are compared, if adjust is set: for
// a caller that knows of resources a sibling is about to create, which the
// table does not count until they are registered. held is the adjusted
// count.
func (p *Pool) NeediestBy(key Key, adjust func(lane, held int) int) (lane, held, own int, ok bool) {
	if p.closed.Load() {
		return 0, 0, 0, false
	}
	ref, found := p.lookupKey(key)
	if !found {
		return 0, 0, 0, false
	}
	s := p.seg
	type next struct {
		lane   int
		ticket uint32
	}
	var waiting [8]next
	ws := waiting[:0]
	oldest := uint32(0)
	for i := range p.l.maskWords {
		for m := atomic.LoadUint64(s.u64(s.keyOff(ref.idx) + kfMasks + 8*i)); m != 0; m &= m - 1 {
			l := i*64 + trailingZeros(m)
			if l >= p.l.nlanes || lnState(atomic.LoadUint64(s.u64(s.laneOff(l)+lnCtl))) != laneLive {
				continue
			}
			t, _, ok := s.laneNext(l, ref.idx)
			if !ok {
				continue
			}
			if len(ws) == 0 || ticketBefore(t, oldest) {
				oldest = t
			}
			if l != p.lane {
				ws = append(ws, next{l, t})
			}
		}
	}
	own, lane, held = p.laneHeld(p.lane, ref), -1, 0
	for _, w := range ws {
		if w.ticket-oldest > p.opts.OrderWindow {
			continue
		}
		h := p.laneHeld(w.lane, ref)
		if adjust != nil {
			h = adjust(w.lane, h)
		}
		if lane < 0 || h < held {
			lane, held = w.lane, h
		}
	}
	return lane, held, own, lane >= 0
}

// laneHeld counts lane l's live resources of ref with capacity. A list that
// points out of the lane ends the count: Neediest only advises.
func (p *Pool) laneHeld(l int, ref keyRef) int {
	s := p.seg
	n := 0
	h := atomic.LoadUint32(s.u32(s.headOff(l, ref.idx)))
	for steps := 0; h != 0 && int(h) <= p.l.perLane && steps < p.l.perLane; steps++ {
		off := s.slotOff(l, int(h)-1)
		if _, capacity, ok := p.liveSlotOf(off, ref); ok && capacity > 0 {
			n++
		}
		h = atomic.LoadUint32(s.u32(off + slNext))
	}
	return n
}

// LiveLanes counts the lanes held by a process, this one's included: the
// fleet's size as the table knows it, a process that died and is not yet
// reclaimed included.
func (p *Pool) LiveLanes() int {
	s := p.seg
	n := 0
	for l := range p.l.nlanes {
		if lnState(atomic.LoadUint64(s.u64(s.laneOff(l)+lnCtl))) == laneLive {
			n++
		}
	}
	return n
}
