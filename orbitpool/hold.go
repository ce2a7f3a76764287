package orbitpool

import (
	"errors"
	"sync/atomic"
	"time"
)

// heldUnit is a unit of a key's budget that a dead process's resource used,
// held by a slot of this lane until the hold ends (see Options.ReclaimHold).
type heldUnit struct {
	id    ResourceID
	until time.Time
}

// hold moves what cleared counts (a dead lane's resources and creations, by
// key entry) into this lane, as live resources with no capacity that no one
// can reserve or find, and takes them off cleared: recount then counts them
// in their keys' budgets and wakes no one for them. A lane with no free slot
// left holds what it can. The structure lock is held exclusively.
func (p *Pool) hold(cleared []int) {
	if p.opts.ReclaimHold <= 0 || p.lane < 0 {
		return
	}
	s := p.seg
	until := time.Now().Add(p.opts.ReclaimHold)
	var held []heldUnit
	p.laneMu.Lock()
	for k, n := range cleared {
		if n == 0 {
			continue
		}
		ref := keyRef{idx: k, gen: kGen(atomic.LoadUint64(s.u64(s.keyOff(k) + kfCtl)))}
		for ; n > 0 && len(p.free) > 0; n-- {
			slot, gen := p.takeFreeSlot(ref, StateLive)
			held = append(held, heldUnit{makeID(p.lane, slot, gen), until})
		}
		cleared[k] = n
	}
	p.laneMu.Unlock()
	if len(held) == 0 {
		return
	}
	p.heldMu.Lock()
	p.held = append(p.held, held...)
	p.heldMu.Unlock()
	// The dispatcher may be asleep for a whole ReconcileInterval: it
	// looks again at when the first hold ends.
	p.ring(p.lane)
}

// releaseHeld gives back the held units whose hold has ended by now, waking
// their keys' waiters, and reports when the next one ends (zero for none).
func (p *Pool) releaseHeld(now time.Time) (next time.Time) {
	p.heldMu.Lock()
	n := 0
	for n < len(p.held) && !p.held[n].until.After(now) {
		n++
	}
	due := p.held[:n:n]
	p.held = p.held[n:]
	if len(p.held) > 0 {
		next = p.held[0].until
	}
	p.heldMu.Unlock()
	for _, h := range due {
		// ErrStale: the lane was left, or healed and recounted, and the
		// unit went back with it.
		err := p.Unregister(h.id)
		if err != nil && !errors.Is(err, ErrStale) && !errors.Is(err, ErrClosed) && p.opts.OnError != nil {
			p.opts.OnError(err)
		}
	}
	return next
}

// isHeld reports whether the live slot at off is a held unit rather than a
// resource: a registered resource always has a creation time.
func (p *Pool) isHeld(off int) bool {
	return atomic.LoadUint64(p.seg.u64(off+slCreated)) == 0
}
