package orbitpool

import (
	"testing"
	"time"
)

// adv51: a dead collector's tombstone over a waiter's entry lasts until the
// key is named again, which may come before the collector's lane is
// reclaimed: the key must then take its entry back in the generation the
// waiter watches (reviveKey), not a new life of the record without the
// waiter's queue.
func TestAdv51KilledCollectorKeyRenamedBeforeReclaim(t *testing.T) {
	p, spec := mpOpenParent(t, Options{ReconcileInterval: time.Hour})
	c := mpStart(t, "adv49-collector-killed", mpArgs{Spec: spec, Key: adv49KeyColl, Reconcile: time.Hour, ResTimeout: time.Second, Lifetime: 30 * time.Second})
	c.expect("ready", 5*time.Second)
	c.send(mpMsg{Type: "collect"})
	c.expect("checked", 5*time.Second)

	r, err := p.Watch(adv49KeyColl)
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	defer func() { r.Close() }()
	c.send(mpMsg{Type: "mark"})
	c.expect("marked", 5*time.Second)
	c.kill()

	// Before any reconcile: a resource of the key is registered (the
	// key is named again), then the dead lane is reclaimed.
	if _, err := p.Register(adv49KeyColl, 1); err != nil {
		t.Fatalf("Register: %v", err)
	}
	if err := p.Reconcile(); err != nil {
		t.Fatalf("Reconcile: %v", err)
	}
	select {
	case <-r.Ready():
	case <-time.After(time.Second):
		ref, _ := p.lookupKey(adv49KeyColl)
		t.Fatalf("a resource of the key was registered (before the dead collector's lane was reclaimed) and its only watcher was not woken within 1s: the watcher sits on entry %d gen %d, the key lives on entry %d gen %d",
			r.w.key, r.w.gen, ref.idx, ref.gen)
	}
}
