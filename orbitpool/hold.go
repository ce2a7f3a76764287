package orbitpool

import (
	"bytes"
	"errors"
	"os"
	"slices"
	"strconv"
	"sync/atomic"
	"time"
)

// heldUnit is a unit of a key's budget that a dead process's resource used,
// held by a slot of this lane until the hold ends (see Options.ReclaimHold).
type heldUnit struct {
	id    ResourceID
	key   Key
	pid   int // the dead process's
	began time.Time
	until time.Time
}

// lingerRecheck is how often a hold that lasts on for a key's lingering
// connections (SetLingering) looks at them again.
const lingerRecheck = 100 * time.Millisecond

// maxExitWait bounds how long a hold waits for its dead process to finish
// exiting (see exiting): seconds at most on a loaded machine, unless the
// process ID names another process by then.
const maxExitWait = 5 * time.Second

// maxLingerHold bounds how long a hold lasts on for lingering connections:
// the kernel's default tcp_fin_timeout, after which it drops a connection
// whose far end never closed.
const maxLingerHold = time.Minute

// hold moves what cleared counts (a dead lane's resources and creations, by
// key entry) into this lane, as live resources with no capacity that no one
// can reserve or find, and takes them off cleared: recount then counts them
// in their keys' budgets and wakes no one for them. A lane with no free slot
// left holds what it can. pid is the dead process's. The structure lock is
// held exclusively.
func (p *Pool) hold(cleared []int, pid int) {
	if p.opts.ReclaimHold <= 0 || p.lane < 0 {
		return
	}
	s := p.seg
	now := time.Now()
	until := now.Add(p.opts.ReclaimHold)
	var held []heldUnit
	p.laneMu.Lock()
	for k, n := range cleared {
		if n == 0 {
			continue
		}
		off := s.keyOff(k)
		ref := keyRef{idx: k, gen: kGen(atomic.LoadUint64(s.u64(off + kfCtl)))}
		key := Key{atomic.LoadUint64(s.u64(off + kfHi)), atomic.LoadUint64(s.u64(off + kfLo))}
		for ; n > 0 && len(p.free) > 0; n-- {
			slot, gen := p.takeFreeSlot(ref, StateLive)
			held = append(held, heldUnit{makeID(p.lane, slot, gen), key, pid, now, until})
		}
		cleared[k] = n
	}
	p.laneMu.Unlock()
	if len(held) == 0 {
		return
	}
	p.heldMu.Lock()
	p.held = append(p.held, held...)
	// A hold kept on for lingering connections may end after these.
	sortHeld(p.held)
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
	p.heldMu.Unlock()
	for _, h := range p.keepLingering(due, now) {
		// ErrStale: the lane was left, or healed and recounted, and the
		// unit went back with it.
		err := p.Unregister(h.id)
		if err != nil && !errors.Is(err, ErrStale) && !errors.Is(err, ErrClosed) && p.opts.OnError != nil {
			p.opts.OnError(err)
		}
	}
	p.heldMu.Lock()
	if len(p.held) > 0 {
		next = p.held[0].until
	}
	p.heldMu.Unlock()
	return next
}

// SetLingering sets how the pool learns how many of the host's connections
// of a key their processes have closed (or died holding) while the far end
// has not closed its side: f returns their number, or a negative one if it
// cannot tell. With ReclaimHold, a hold that ends while its key has such
// connections lasts on for as many units as they number, looked at again
// every lingerRecheck, for at most maxLingerHold in all: the far end still
// counts them. f runs on the dispatcher goroutine and should return within
// a millisecond.
func (p *Pool) SetLingering(f func(Key) int) {
	p.lingering.Store(&f)
}

// keepLingering holds on, for another lingerRecheck, as many of due's units
// of each key as the key has lingering connections beyond the units still
// held for it, and returns the others, which go back.
func (p *Pool) keepLingering(due []heldUnit, now time.Time) []heldUnit {
	f := p.lingering.Load()
	if f == nil || *f == nil || len(due) == 0 {
		return due
	}
	lingering := make(map[Key]int)
	for _, h := range due {
		if _, ok := lingering[h.key]; !ok {
			lingering[h.key] = (*f)(h.key)
		}
	}
	p.heldMu.Lock()
	defer p.heldMu.Unlock()
	// Units whose hold has not ended yet stand for as many lingering
	// connections.
	for _, h := range p.held {
		lingering[h.key]--
	}
	done := make(map[int]bool) // by pid: the dead process has finished exiting
	give := due[:0]
	kept := false
	for _, h := range due {
		if now.Sub(h.began) >= maxLingerHold {
			give = append(give, h)
			continue
		}
		switch {
		case now.Sub(h.began) < maxExitWait && !exited(done, h.pid):
			// Found dead as soon as it closed its segment, the process
			// may not have closed its connections yet: none lingers
			// until it has.
		case lingering[h.key] > 0:
			lingering[h.key]--
		default:
			give = append(give, h)
			continue
		}
		h.until = now.Add(lingerRecheck)
		p.held = append(p.held, h)
		kept = true
	}
	if kept {
		sortHeld(p.held)
	}
	return give
}

// exiting reports whether process pid, found dead, is still closing its
// files: the kernel releases the segment's lock, by which the fleet finds a
// process dead, as it closes the process's files one by one, and a loaded
// machine can hold it off its processor in the middle for a long while. A
// process that has closed them all is a zombie or gone.
func exiting(pid int) bool {
	if pid <= 0 {
		return false
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// The state follows the command name, which is in parentheses and
	// may hold any byte.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return false
	}
	st := b[i+2]
	return st != 'Z' && st != 'X'
}

// exited is !exiting(pid), asked once per pid and kept in done.
func exited(done map[int]bool, pid int) bool {
	d, ok := done[pid]
	if !ok {
		d = !exiting(pid)
		done[pid] = d
	}
	return d
}

// sortHeld puts held in the order the units' holds end.
func sortHeld(held []heldUnit) {
	slices.SortStableFunc(held, func(a, b heldUnit) int { return a.until.Compare(b.until) })
}

// isHeld reports whether the live slot at off is a held unit rather than a
// resource: a registered resource always has a creation time.
func (p *Pool) isHeld(off int) bool {
	return atomic.LoadUint64(p.seg.u64(off+slCreated)) == 0
}
