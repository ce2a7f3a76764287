package orbitpool

import (
	"sync/atomic"
	"testing"
	"time"
)

// adv54: reviveKey finds a dead collector's tombstone only through its index
// entry. But freeIndexEntry counts an entry naming a record that is not live
// as stale and gives its position to the next key whose probe sequence
// passes there. So when another key sharing the home position is named
// between the half-way collection and the key being named again, the
// tombstone's index entry is overwritten, reviveKey misses it, the key gets
// a new record, and the waiter watching the tombstone's life is never woken
// (the adv49 strand, by one more step). Such an entry is now not stale
// (staleIndexEntry).
func TestAdv54ReviveMissesOverwrittenIndex(t *testing.T) {
	p, err := Open(PoolSpec{Lanes: 2, Keys: 4, ResourcesPerLane: 4}, Options{ReconcileInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	s := p.seg
	m := uint64(p.l.nindex - 1)
	a := Key{Hi: 0xa54, Lo: 1}
	var b Key
	for i := uint64(1); ; i++ {
		b = Key{Hi: 0xb54, Lo: i}
		if s.keyHash(b)&m == s.keyHash(a)&m {
			break
		}
	}
	r, err := p.Watch(a)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { r.Close() }()
	// collectKeys' mark, and nothing after it (its process killed there).
	ref, _ := p.lookupKey(a)
	ctl := s.u64(s.keyOff(ref.idx) + kfCtl)
	if c := atomic.LoadUint64(ctl); !atomic.CompareAndSwapUint64(ctl, c, keyCtl(kGen(c), keyTomb)) {
		t.Fatal("mark")
	}
	// Another key with the same home position is named.
	if _, err := p.Register(b, 1); err != nil {
		t.Fatalf("Register(b): %v", err)
	}
	// The watched key is named again, and a resource of it registered.
	if _, err := p.Register(a, 1); err != nil {
		t.Fatalf("Register(a): %v", err)
	}
	if err := p.Reconcile(); err != nil {
		t.Fatalf("Reconcile: %v", err)
	}
	select {
	case <-r.Ready():
	case <-time.After(time.Second):
		ra, _ := p.lookupKey(a)
		t.Fatalf("a resource of the key was registered and its only watcher was not woken within 1s: it watches entry %d gen %d (a tombstone whose index position key b took), the key now lives on entry %d gen %d",
			ref.idx, ref.gen, ra.idx, ra.gen)
	}
}
