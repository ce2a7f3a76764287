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

// errStaleView is a creation claim refused because a resource of the key
// was made since the claimant looked for one with room: under MaxCreating 1
// a creation that finished between the look and the claim would otherwise
// be followed by a second one nobody needed.
var errStaleView = errors.New("orbitpool: a resource was made since the view")

// maxKeyRetries bounds how often an operation looks a key up again after its
// entry was recycled under it. A correct table recycles an entry only when it
// has no resources, claims or waiters, which an operation racing for it
// quickly gives it; retrying without end would turn a corrupt entry into a
// spinning goroutine.
const maxKeyRetries = 64

func errKeyChurn(k Key) error {
	return fmt.Errorf("orbitpool: key %v: its table entry was recycled %d times in a row: %w", k, maxKeyRetries, ErrCorrupt)
}

// The key table is reached through a hash index of nindex entries, a power of
// two at least four times the table, so the index is at most a quarter full
// however many keys are named. A key is placed within maxProbe entries of its
// home, and a look-up never reads further: a hit or a miss costs a few entries
// at any fill, tombstones included. An index entry holds the key record's
// index plus one in its low half and a tag from the key's hash in its high
// half, so that entries of other keys are passed over without reading their
// records; 0 is an empty entry, idxTomb one whose key was collected.
const (
	maxProbe = 64
	idxTomb  = ^uint64(0)
)

// indexSize is the number of index entries for a table of keys records.
func indexSize(keys int) int {
	n := 1
	for n < 4*keys {
		n <<= 1
	}
	return n
}

// mix64 spreads a word's bits over all of it (see segment.keyHash): the
// caller's digest is meant to be uniform, but nothing forbids keys that differ
// in a few bits only.
func mix64(h uint64) uint64 {
	h ^= h >> 30
	h *= 0xbf58476d1ce4e5b9
	h ^= h >> 27
	h *= 0x94d049bb133111eb
	return h ^ h>>31
}

func idxTag(h uint64) uint64 { return (h>>32 | 1) << 32 }

func (s *segment) indexOff(i int) int { return s.l.index + i*8 }

// lookupKey finds k without taking any lock.
func (p *Pool) lookupKey(k Key) (keyRef, bool) {
	ref, _, ok := p.findEntry(k, keyLive)
	return ref, ok
}

// findEntry finds the record in state st that holds k through the key index,
// and returns its control word as read. Readers check the entry's state and
// generation before and after reading the digest, so a concurrent reuse of
// the entry is never taken for a match.
func (p *Pool) findEntry(k Key, st int) (keyRef, uint64, bool) {
	s := p.seg
	h := s.keyHash(k)
	tag, m := idxTag(h), uint64(p.l.nindex-1)
	for i := range uint64(maxProbe) {
		e := atomic.LoadUint64(s.u64(s.indexOff(int((h + i) & m))))
		if e == 0 {
			break
		}
		if e&^0xffffffff != tag {
			continue
		}
		idx := int(uint32(e)) - 1
		if idx < 0 || idx >= p.l.nkeys {
			continue // corrupt; a look-up never trusts it
		}
		off := s.keyOff(idx)
		c := atomic.LoadUint64(s.u64(off + kfCtl))
		if kState(c) != st {
			continue
		}
		hi := atomic.LoadUint64(s.u64(off + kfHi))
		lo := atomic.LoadUint64(s.u64(off + kfLo))
		if hi == k.Hi && lo == k.Lo && kHead(atomic.LoadUint64(s.u64(off+kfCtl))) == kHead(c) {
			return keyRef{idx, kGen(c)}, c, true
		}
	}
	return keyRef{}, 0, false
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
		if ref, ok := p.reviveKey(k); ok {
			return ref, nil
		}
		idx, ok := p.freeKeyEntry()
		pos, pok := p.freeIndexEntry(k)
		if ok && pok {
			off := s.keyOff(idx)
			gen := kGen(atomic.LoadUint64(s.u64(off+kfCtl))) + 1
			atomic.StoreUint64(s.u64(off+kfHi), k.Hi)
			atomic.StoreUint64(s.u64(off+kfLo), k.Lo)
			p.resetKeyEntry(idx)
			atomic.StoreUint64(s.u64(off+kfCtl), keyCtl(gen, keyLive))
			atomic.StoreUint64(s.u64(s.indexOff(pos)), idxTag(s.keyHash(k))|uint64(idx+1))
			return keyRef{idx, gen & kGenMask}, nil
		}
		if attempt > 0 || p.collectKeys() == 0 {
			if ok {
				return keyRef{}, fmt.Errorf("orbitpool: key %v: no free index entry within %d of its hash: %w", k, maxProbe, ErrFull)
			}
			return keyRef{}, fmt.Errorf("orbitpool: all %d key entries are in use; raise the spec's Keys: %w", p.l.nkeys, ErrFull)
		}
	}
}

// resetKeyEntry clears what the previous key of entry idx left in the
// per-lane tables. The structure lock is held exclusively.
func (p *Pool) resetKeyEntry(idx int) {
	s := p.seg
	atomic.StoreUint64(s.u64(s.keyOff(idx)+kfUnclaimed), 0)
	atomic.StoreUint64(s.u64(s.keyOff(idx)+kfRoomSeq), 0)
	for l := range p.l.nlanes {
		clear(s.data[s.statOff(l, idx) : s.statOff(l, idx)+statSize])
		atomic.StoreUint64(s.u64(s.queueOff(l, idx)), 0)
		atomic.StoreUint64(s.u64(s.queueOff(l, idx)+8), 0)
		atomic.StoreUint64(s.u64(s.queueOff(l, idx)+qHeldOff), 0)
		atomic.AndUint64(s.u64(s.roomOff(idx, l)), 0)
		atomic.AndUint64(s.u64(s.watchOff(idx, l)), 0)
	}
}

// reviveKey finishes what a collector killed half-way through collecting k
// left undone. collectKeys marks an idle entry a tombstone, then re-reads its
// waiter mask and either takes the entry out of the index or, if a waiter
// came in between, makes it live again. A collector killed between the two
// leaves an indexed tombstone, perhaps over a waiter that watches that
// generation of the entry. So when k has no live entry, an indexed tombstone
// that holds k is made live again, in the generation its waiters watch: the
// collector's own undo, which is always right, since the entry is idle. It is
// done here, where k is named again, and nowhere earlier: only under the
// structure lock and with no live entry for k can it not make two. The
// structure lock is held.
func (p *Pool) reviveKey(k Key) (keyRef, bool) {
	ref, c, ok := p.findEntry(k, keyTomb)
	if !ok || !atomic.CompareAndSwapUint64(p.seg.u64(p.seg.keyOff(ref.idx)+kfCtl), c, keyCtl(ref.gen, keyLive)|c&(1<<kStShift-1)) {
		return keyRef{}, false
	}
	return ref, true
}

// freeKeyEntry finds a key record no key holds, one with no waiter's or
// watch's mask bit if it can: a bit on a record that is not live is a waiter
// of its earlier life that has not yet found out, and a new key there would
// hand it its units. The structure lock is held.
func (p *Pool) freeKeyEntry() (int, bool) {
	s := p.seg
	found := -1
	for idx := range p.l.nkeys {
		if kState(atomic.LoadUint64(s.u64(s.keyOff(idx)+kfCtl))) == keyLive {
			continue
		}
		if !p.awaited(idx) {
			return idx, true
		}
		if found < 0 {
			found = idx
		}
	}
	return found, found >= 0
}

// freeIndexEntry finds where k's index entry goes: the first entry on its
// probe sequence that is empty, a tombstone, or stale (see staleIndexEntry).
// The structure lock is held, and k is not in the index.
func (p *Pool) freeIndexEntry(k Key) (int, bool) {
	s := p.seg
	h, m := s.keyHash(k), uint64(p.l.nindex-1)
	for i := range uint64(maxProbe) {
		pos := int((h + i) & m)
		if e := atomic.LoadUint64(s.u64(s.indexOff(pos))); e == 0 || e == idxTomb || p.staleIndexEntry(e) {
			return pos, true
		}
	}
	return 0, false
}

// staleIndexEntry reports whether index entry e names no record that holds a
// key of its hash: a record out of range, empty, or holding a key of another
// hash, which a process that died half-way through naming or collecting a
// key leaves behind. A tombstone record of e's hash is not stale: it is a key
// half-collected by a process that died, which the key takes back when it is
// named again (see reviveKey), through this entry.
func (p *Pool) staleIndexEntry(e uint64) bool {
	s := p.seg
	idx := int(uint32(e)) - 1
	if idx < 0 || idx >= p.l.nkeys {
		return true
	}
	off := s.keyOff(idx)
	if st := kState(atomic.LoadUint64(s.u64(off + kfCtl))); st != keyLive && st != keyTomb {
		return true
	}
	k := Key{atomic.LoadUint64(s.u64(off + kfHi)), atomic.LoadUint64(s.u64(off + kfLo))}
	return idxTag(s.keyHash(k)) != e&^0xffffffff
}

// awaited reports whether any process has a waiter or a watch (see WatchRoom)
// on key entry k: a watch's process waits for the key's room as a waiter
// does, and an entry given to another key under it would never wake it.
func (p *Pool) awaited(k int) bool {
	if p.queued(k) {
		return true
	}
	for i := range p.l.maskWords {
		if atomic.LoadUint64(p.seg.u64(p.seg.watchOff(k, 64*i))) != 0 {
			return true
		}
	}
	return false
}

// clearStrayWaiters clears key entry k's waiter and watch mask bits of lanes
// that no process holds (neither its record nor the kernel's lock says so),
// which only a corrupt segment has (a lane's own bits are cleared as it
// leaves or is reclaimed), and reports whether none is left: a stray bit
// would keep the entry from being collected forever. The structure lock is
// held, so no lane joins meanwhile.
func (p *Pool) clearStrayWaiters(k int) bool {
	s := p.seg
	for j := range 2 * p.l.maskWords {
		// The waiter mask's words, then the watch mask's.
		i, kind, w := j, "waiter", s.u64(s.maskOff(k, 64*j))
		if j >= p.l.maskWords {
			i, kind = j-p.l.maskWords, "watch"
			w = s.u64(s.watchOff(k, 64*i))
		}
		for m := atomic.LoadUint64(w); m != 0; m &= m - 1 {
			l := i*64 + trailingZeros(m)
			if l < p.l.nlanes {
				if lnState(atomic.LoadUint64(s.u64(s.laneOff(l)+lnCtl))) == laneLive {
					continue
				}
				if alive, err := s.laneAlive(l); err != nil || alive {
					continue // a live process's record, overwritten: see healOwnLane
				}
			}
			atomic.AndUint64(w, ^laneBit(l))
			if f := p.opts.OnError; f != nil {
				// Not under the structure lock, which f may want.
				go f(fmt.Errorf("orbitpool: key entry %d had a %s bit for lane %d, which no process holds; cleared: %w", k, kind, l, ErrCorrupt))
			}
		}
	}
	return !p.awaited(k)
}

// collectKeys turns entries with no resources, claims, waiters or watches
// into tombstones, so a long-lived fleet that has seen many upstreams can
// name new ones. It runs only when the table is full. The structure lock is
// held.
func (p *Pool) collectKeys() int {
	s, freed := p.seg, 0
	for idx := range p.l.nkeys {
		off := s.keyOff(idx)
		c := atomic.LoadUint64(s.u64(off + kfCtl))
		if kState(c) != keyLive || kTotal(c) != 0 || kCreating(c) != 0 || p.awaited(idx) && !p.clearStrayWaiters(idx) {
			continue
		}
		tomb := keyCtl(kGen(c), keyTomb)
		if !atomic.CompareAndSwapUint64(s.u64(off+kfCtl), c, tomb) {
			continue
		}
		// A waiter or a watch sets its mask bit and then reads the
		// control word; so mark first and read the masks after: either
		// the waiter sees the tombstone and looks the key up again, or
		// this sees its bit and leaves the entry to it.
		if p.awaited(idx) {
			atomic.CompareAndSwapUint64(s.u64(off+kfCtl), tomb, c)
			continue
		}
		p.unindex(Key{atomic.LoadUint64(s.u64(off + kfHi)), atomic.LoadUint64(s.u64(off + kfLo))}, idx)
		freed++
	}
	if freed > 0 {
		p.sweepTombs()
	}
	return freed
}

// unindex turns record idx's index entry for k into a tombstone.
func (p *Pool) unindex(k Key, idx int) {
	s := p.seg
	h, m := s.keyHash(k), uint64(p.l.nindex-1)
	for i := range uint64(maxProbe) {
		e := s.u64(s.indexOff(int((h + i) & m)))
		if v := atomic.LoadUint64(e); v != idxTomb && int(uint32(v)) == idx+1 {
			atomic.StoreUint64(e, idxTomb)
			return
		}
	}
}

// sweepTombs empties the tombstones that an empty entry follows: no key's
// probe sequence runs through them, since an insertion never passes an empty
// entry, so look-ups that would stop a little later stop there.
func (p *Pool) sweepTombs() {
	s, n := p.seg, p.l.nindex
	for i := range n {
		if atomic.LoadUint64(s.u64(s.indexOff(i))) != 0 {
			continue
		}
		for j, steps := (i+n-1)%n, 0; steps < n; j, steps = (j+n-1)%n, steps+1 {
			e := s.u64(s.indexOff(j))
			if atomic.LoadUint64(e) != idxTomb {
				break
			}
			atomic.StoreUint64(e, 0)
		}
	}
}

// keyClaim counts one more resource being created under key ref, within lim
// unless force is set. seenLive, unless negative, is how many of the key's
// resources were live (made, not being created) when the caller looked for
// one with room: if more are now, one the caller has not seen may have room,
// and the claim fails with errStaleView.
func (p *Pool) keyClaim(ref keyRef, lim Limits, force bool, seenLive int) error {
	ctl := p.seg.u64(p.seg.keyOff(ref.idx) + kfCtl)
	for {
		c := atomic.LoadUint64(ctl)
		if kState(c) != keyLive || kGen(c) != ref.gen {
			return errKeyGone
		}
		total, creating := kTotal(c), kCreating(c)
		if seenLive >= 0 && total-creating > seenLive {
			return errStaleView
		}
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
