package orbitpool

import (
	"sync/atomic"
	"testing"
)

// adv52: the returning mark that Unregister leaves on a slot until it has woken
// the key's waiters survives the slot being taken again for a creation in
// between: it moves to the lane's returning count for the key, which the
// unregistering goroutine then decrements; and a recount takes every mark.
func TestAdv52ReturningMarkMovesOnReuse(t *testing.T) {
	p, err := Open(PoolSpec{Lanes: 2, Keys: 8, ResourcesPerLane: 4}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	key := Key{Hi: 0xad52, Lo: 1}
	id, err := p.Register(key, 1)
	if err != nil {
		t.Fatal(err)
	}
	s := p.seg
	off := s.slotOff(p.lane, id.Slot())
	k, kg, ok := p.slotKey(off)
	if !ok {
		t.Fatal("slot names no key")
	}
	// Unregister's steps up to its wake-up.
	w := atomic.LoadUint64(s.u64(off + slWord))
	freed := slotWord(nextGen(wGen(w)), StateFree, 0, 0)
	if !atomic.CompareAndSwapUint64(s.u64(off+slWord), w, freed|slReturning) {
		t.Fatal("free")
	}
	p.laneMu.Lock()
	p.unlink(k, id.Slot())
	p.free = append(p.free, int32(id.Slot()))
	p.laneMu.Unlock()
	p.keyRelease(k, kg, false)

	// A creation takes the slot before the wake-up is done.
	cp, err := p.ClaimCreate(key, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if cp.slot != id.Slot() {
		t.Fatalf("creation took slot %d, want %d", cp.slot, id.Slot())
	}
	ret := s.u32(s.returningOff(p.lane, k))
	if got := atomic.LoadUint32(ret); got != 1 {
		t.Fatalf("returning count %d after the slot was taken, want 1", got)
	}
	if w := atomic.LoadUint64(s.u64(off + slWord)); w&slReturning != 0 || wState(w) != StateCreating {
		t.Fatalf("slot word %#x, want creating without the mark", w)
	}
	p.returned(off, freed, k)
	if got := atomic.LoadUint32(ret); got != 0 {
		t.Fatalf("returning count %d after the wake-up, want 0", got)
	}

	// A permit's Close marks and clears its slot.
	if err := cp.Close(); err != nil {
		t.Fatal(err)
	}
	if w := atomic.LoadUint64(s.u64(off + slWord)); w&slReturning != 0 || wState(w) != StateFree {
		t.Fatalf("slot word %#x after Close, want free without the mark", w)
	}

	// A recount takes the marks left behind, both kinds.
	atomic.OrUint64(s.u64(off+slWord), slReturning)
	atomic.StoreUint32(ret, 2)
	if err := s.lockStructure(); err != nil {
		t.Fatal(err)
	}
	p.recount(nil)
	s.unlockStructure()
	if w := atomic.LoadUint64(s.u64(off + slWord)); w&slReturning != 0 {
		t.Fatalf("slot word %#x after recount, want the mark taken", w)
	}
	if got := atomic.LoadUint32(ret); got != 0 {
		t.Fatalf("returning count %d after recount, want 0", got)
	}
}
