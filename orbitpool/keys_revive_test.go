package orbitpool

import (
	"sync/atomic"
	"testing"
	"time"
)

// A collector killed between marking an idle entry a tombstone and
// re-reading its waiter mask leaves the tombstone indexed, over a waiter that
// watches that life of the entry (see reviveKey). Another key named first
// must take neither the record nor its index entry, and the key named again
// must wake the waiter.
func TestHalfCollectedKeyKeepsItsWaiter(t *testing.T) {
	p, err := Open(PoolSpec{Lanes: 2, Keys: 4, ResourcesPerLane: 4}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	s := p.seg
	// b's probe sequence starts where a's does, at a's index entry.
	a, b := Key{Hi: 0xa, Lo: 1}, Key{Hi: 0xb}
	for m := uint64(p.l.nindex - 1); s.keyHash(b)&m != s.keyHash(a)&m; b.Lo++ {
	}
	r, err := p.Watch(a)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { r.Close() }()
	// collectKeys' mark, and nothing after it.
	ref, _ := p.lookupKey(a)
	ctl := s.u64(s.keyOff(ref.idx) + kfCtl)
	if c := atomic.LoadUint64(ctl); !atomic.CompareAndSwapUint64(ctl, c, keyCtl(kGen(c), keyTomb)) {
		t.Fatal("mark")
	}

	if _, err := p.Register(b, 1); err != nil {
		t.Fatalf("Register(b): %v", err)
	}
	if rb, _ := p.lookupKey(b); rb.idx == ref.idx {
		t.Fatalf("key b took record %d, whose earlier life has a waiter", rb.idx)
	}
	if _, err := p.Register(a, 1); err != nil {
		t.Fatalf("Register(a): %v", err)
	}
	live := 0
	for idx := range p.l.nkeys {
		off := s.keyOff(idx)
		if kState(atomic.LoadUint64(s.u64(off+kfCtl))) == keyLive && atomic.LoadUint64(s.u64(off+kfHi)) == a.Hi && atomic.LoadUint64(s.u64(off+kfLo)) == a.Lo {
			live++
		}
	}
	if ra, _ := p.lookupKey(a); live != 1 || ra != ref {
		t.Fatalf("key a named again: %d live entries, found at %+v; want one, the watched %+v", live, ra, ref)
	}
	select {
	case <-r.Ready():
	case <-time.After(time.Second):
		t.Fatal("a resource of the key was registered and its watcher was not woken")
	}
}
