package orbitpool

import (
	"errors"
	"fmt"
	"sync/atomic"
)

// keyRef names a key-table entry in one of its lives.
type keyRef struct {
	idx int
	gen uint32
}

// errKeyGone means a key entry was recycled under us; look the key up again.
var errKeyGone = errors.New("orbitpool: key entry recycled")

// maxKeyRetries bounds how often an operation looks a key up again after its
// entry was recycled under it. A correct table recycles an entry only when it
// has no resources, claims or waiters, which an operation racing for it
// quickly gives it; retrying without end would turn a corrupt entry into a
// spinning goroutine.
const maxKeyRetries = 64

func errKeyChurn(k Key) error {
	return fmt.Errorf("orbitpool: key %v: its table entry was recycled %d times in a row: %w", k, maxKeyRetries, ErrCorrupt)
}

func keyHash(k Key) uint64 { return (k.Hi ^ k.Lo*0x9e3779b97f4a7c15) >> 7 }

// lookupKey finds k without taking any lock. Readers check the entry's state
// and generation before and after reading the digest, so a concurrent reuse of
// the entry is never taken for a match.
func (p *Pool) lookupKey(k Key) (keyRef, bool) {
	s, n := p.seg, p.l.nkeys
	h := int(keyHash(k) % uint64(n))
	for i := range n {
		idx := (h + i) % n
		off := s.keyOff(idx)
		c := atomic.LoadUint64(s.u64(off + kfCtl))
		switch kState(c) {
		case keyEmpty:
			return keyRef{}, false
		case keyLive:
			hi := atomic.LoadUint64(s.u64(off + kfHi))
			lo := atomic.LoadUint64(s.u64(off + kfLo))
			if hi == k.Hi && lo == k.Lo && kHead(atomic.LoadUint64(s.u64(off+kfCtl))) == kHead(c) {
				return keyRef{idx, kGen(c)}, true
			}
		}
	}
	return keyRef{}, false
}

// internKey finds k or gives it an entry.
func (p *Pool) internKey(k Key) (keyRef, error) {
	if ref, ok := p.lookupKey(k); ok {
		return ref, nil
	}
	s := p.seg
	if err := s.lockStructure(); err != nil {
		return keyRef{}, err
	}
	defer s.unlockStructure()
	for attempt := 0; ; attempt++ {
		if ref, ok := p.lookupKey(k); ok {
			return ref, nil
		}
		if idx, ok := p.freeKeyEntry(k); ok {
			off := s.keyOff(idx)
			gen := kGen(atomic.LoadUint64(s.u64(off+kfCtl))) + 1
			atomic.StoreUint64(s.u64(off+kfHi), k.Hi)
			atomic.StoreUint64(s.u64(off+kfLo), k.Lo)
			for l := range p.l.nlanes {
				clear(s.data[s.statOff(l, idx) : s.statOff(l, idx)+statSize])
			}
			atomic.StoreUint64(s.u64(off+kfCtl), keyCtl(gen, keyLive))
			return keyRef{idx, gen & kGenMask}, nil
		}
		if attempt > 0 || p.collectKeys() == 0 {
			return keyRef{}, fmt.Errorf("orbitpool: all %d key entries are in use: %w", p.l.nkeys, ErrFull)
		}
	}
}

// freeKeyEntry finds where k would be inserted: the first tombstone or empty
// entry on its probe sequence. The structure lock is held.
func (p *Pool) freeKeyEntry(k Key) (int, bool) {
	s, n := p.seg, p.l.nkeys
	h := int(keyHash(k) % uint64(n))
	for i := range n {
		idx := (h + i) % n
		if kState(atomic.LoadUint64(s.u64(s.keyOff(idx)+kfCtl))) != keyLive {
			return idx, true
		}
	}
	return 0, false
}

// collectKeys turns entries with no resources, claims or waiters into
// tombstones, so a long-lived fleet that has seen many upstreams can name new
// ones. It runs only when the table is full. The structure lock is held.
func (p *Pool) collectKeys() int {
	s, freed := p.seg, 0
	for idx := range p.l.nkeys {
		off := s.keyOff(idx)
		c := atomic.LoadUint64(s.u64(off + kfCtl))
		if kState(c) != keyLive || kTotal(c) != 0 || kCreating(c) != 0 || atomic.LoadUint64(s.u64(off+kfMask)) != 0 {
			continue
		}
		tomb := keyCtl(kGen(c), keyTomb)
		if !atomic.CompareAndSwapUint64(s.u64(off+kfCtl), c, tomb) {
			continue
		}
		// A waiter sets its mask bit and then reads the control word; so
		// mark first and read the mask after: either the waiter sees the
		// tombstone and looks the key up again, or this sees its bit and
		// leaves the entry to it.
		if atomic.LoadUint64(s.u64(off+kfMask)) != 0 {
			atomic.CompareAndSwapUint64(s.u64(off+kfCtl), tomb, c)
			continue
		}
		freed++
	}
	return freed
}

// keyClaim counts one more resource being created under key ref, within lim
// unless force is set.
func (p *Pool) keyClaim(ref keyRef, lim Limits, force bool) error {
	ctl := p.seg.u64(p.seg.keyOff(ref.idx) + kfCtl)
	for {
		c := atomic.LoadUint64(ctl)
		if kState(c) != keyLive || kGen(c) != ref.gen {
			return errKeyGone
		}
		total, creating := kTotal(c), kCreating(c)
		if !force {
			if lim.MaxResources > 0 && total >= lim.MaxResources {
				return fmt.Errorf("orbitpool: key has %d of %d resources: %w", total, lim.MaxResources, ErrBudget)
			}
			if lim.MaxCreating > 0 && creating >= lim.MaxCreating {
				return fmt.Errorf("orbitpool: key has %d of %d creations in progress: %w", creating, lim.MaxCreating, ErrBudget)
			}
		}
		if total >= kCountMask || creating >= kCountMask {
			return fmt.Errorf("orbitpool: key counters saturated: %w", ErrFull)
		}
		if atomic.CompareAndSwapUint64(ctl, c, c+kTotalOne+kCreatingOne) {
			return nil
		}
	}
}

// keyRelease gives back one resource of key k (and its creation claim if it
// was still being created). Counts never go below zero, whatever the table
// says.
func (p *Pool) keyRelease(k int, gen uint32, creating bool) {
	ctl := p.seg.u64(p.seg.keyOff(k) + kfCtl)
	for {
		c := atomic.LoadUint64(ctl)
		if kGen(c) != gen || kTotal(c) == 0 {
			return
		}
		n := c - kTotalOne
		if creating && kCreating(c) > 0 {
			n -= kCreatingOne
		}
		if atomic.CompareAndSwapUint64(ctl, c, n) {
			return
		}
	}
}

// keyCreated turns one of key k's creation claims into a live resource.
func (p *Pool) keyCreated(k int, gen uint32) {
	ctl := p.seg.u64(p.seg.keyOff(k) + kfCtl)
	for {
		c := atomic.LoadUint64(ctl)
		if kGen(c) != gen || kCreating(c) == 0 {
			return
		}
		if atomic.CompareAndSwapUint64(ctl, c, c-kCreatingOne) {
			return
		}
	}
}
