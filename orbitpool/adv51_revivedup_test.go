package orbitpool

import (
	"sync/atomic"
	"testing"
	"time"
)

// adv51: reviving a dead collector's tombstone must not give the key a second
// live entry. Here the key's probe sequence has a free position before the
// tombstone's (an idle key collected after the collector died), where a new
// entry would be indexed first; the key named again must still end with one
// live entry, the watched one.
func TestAdv51ReviveMakesDuplicateLiveKey(t *testing.T) {
	p, spec := mpOpenParent(t, Options{ReconcileInterval: time.Hour})
	s := p.seg
	m := uint64(p.l.nindex - 1)
	k := adv49KeyColl
	// A key whose probe sequence starts where k's does, named first and
	// idle: k's entry goes one position later.
	var b Key
	for i := uint64(1); ; i++ {
		b = Key{Hi: 0xb51, Lo: i}
		if s.keyHash(b)&m == s.keyHash(k)&m && b != k {
			break
		}
	}
	cp, err := p.ClaimCreate(b, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	cp.Close()

	c := mpStart(t, "adv49-collector-killed", mpArgs{Spec: spec, Key: k, Reconcile: time.Hour, ResTimeout: time.Second, Lifetime: 30 * time.Second})
	c.expect("ready", 5*time.Second)
	c.send(mpMsg{Type: "collect"})
	c.expect("checked", 5*time.Second)
	r, err := p.Watch(k)
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	defer func() { r.Close() }()
	c.send(mpMsg{Type: "mark"})
	c.expect("marked", 5*time.Second)
	c.kill()

	// The idle key b is collected (as a full table has it), and k is
	// named again, before the dead collector's lane is reclaimed.
	if err := s.lockStructure(); err != nil {
		t.Fatal(err)
	}
	p.collectKeys()
	s.unlockStructure()
	if _, err := p.Register(k, 1); err != nil {
		t.Fatalf("Register: %v", err)
	}
	if err := p.Reconcile(); err != nil {
		t.Fatalf("Reconcile: %v", err)
	}

	var live []int
	for idx := range p.l.nkeys {
		off := s.keyOff(idx)
		if kState(atomic.LoadUint64(s.u64(off+kfCtl))) == keyLive &&
			atomic.LoadUint64(s.u64(off+kfHi)) == k.Hi && atomic.LoadUint64(s.u64(off+kfLo)) == k.Lo {
			live = append(live, idx)
		}
	}
	woken := false
	select {
	case <-r.Ready():
		woken = true
	case <-time.After(time.Second):
	}
	if len(live) != 1 || !woken {
		ref, _ := p.lookupKey(k)
		t.Fatalf("after reclaim the key has live entries %v (want one; look-ups find %d), and its watcher on entry %d gen %d woken within 1s of a resource registered: %v",
			live, ref.idx, r.w.key, r.w.gen, woken)
	}
}
