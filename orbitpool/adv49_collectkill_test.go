package orbitpool

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"
)

// adv49: collectKeys marks an idle key's entry a tombstone and then reads
// the key's waiter mask, undoing the mark if a waiter registered meanwhile
// (a waiter sets its bit, then reads ctl). A collector killed between the
// mark and that second read leaves a waiter registered on a dead entry: the
// key is named again in another life (the entry is reused, its waiter mask
// kept but its queue words reset), units for it are handed to that life's
// queue, and the waiter is never woken. Reclaiming the dead collector's lane
// does not look at the entry; naming the key again must (reviveKey).

var adv49KeyColl = Key{Hi: 0xad49, Lo: 3}

func init() { mpMoreRoles["adv49-collector-killed"] = adv49RoleCollectorKilled }

// adv49RoleCollectorKilled names the key (no resource, no claim, no waiter:
// collectable), then runs collectKeys' statements for its entry with the
// structure lock held, and is killed after marking it a tombstone, before
// the mask's second read.
func adv49RoleCollectorKilled(c *mpChildCtx) error {
	p, err := c.open()
	if err != nil {
		return err
	}
	cp, err := p.ClaimCreate(c.args.Key, Limits{})
	if err != nil {
		return err
	}
	cp.Close()
	ref, ok := p.lookupKey(c.args.Key)
	if !ok {
		return fmt.Errorf("key not named")
	}
	c.send(mpMsg{Type: "ready", Lane: p.Lane(), N: ref.idx})
	if _, err := c.expect("collect"); err != nil {
		return err
	}
	s := p.seg
	if err := s.lockStructure(); err != nil {
		return err
	}
	// collectKeys, verbatim, for entry ref.idx.
	off := s.keyOff(ref.idx)
	cw := atomic.LoadUint64(s.u64(off + kfCtl))
	if kState(cw) != keyLive || kTotal(cw) != 0 || kCreating(cw) != 0 || p.queued(ref.idx) {
		return fmt.Errorf("entry %d not collectable: ctl %#x queued %v", ref.idx, cw, p.queued(ref.idx))
	}
	// The waiter sets its bit and reads ctl here, between the collector's
	// first read of the mask and its compare-and-swap.
	c.send(mpMsg{Type: "checked"})
	if _, err := c.expect("mark"); err != nil {
		return err
	}
	tomb := keyCtl(kGen(cw), keyTomb)
	if !atomic.CompareAndSwapUint64(s.u64(off+kfCtl), cw, tomb) {
		return fmt.Errorf("ctl changed")
	}
	// SIGKILL lands here, before `if p.queued(idx) { undo }`.
	c.send(mpMsg{Type: "marked"})
	time.Sleep(time.Minute)
	return fmt.Errorf("not killed")
}

func TestAdv49KilledCollectorStrandsWatcher(t *testing.T) {
	p, spec := mpOpenParent(t, Options{ReconcileInterval: time.Hour})
	c := mpStart(t, "adv49-collector-killed", mpArgs{Spec: spec, Key: adv49KeyColl, Reconcile: time.Hour, ResTimeout: time.Second, Lifetime: 30 * time.Second})
	c.expect("ready", 5*time.Second)
	c.send(mpMsg{Type: "collect"})
	c.expect("checked", 5*time.Second)

	r, err := p.Watch(adv49KeyColl)
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	defer r.Close()
	c.send(mpMsg{Type: "mark"})
	c.expect("marked", 5*time.Second)
	c.kill()
	if err := p.Reconcile(); err != nil {
		t.Fatalf("Reconcile: %v", err)
	}
	select {
	case <-r.Ready():
		t.Fatalf("watcher woken before any capacity came back")
	default:
	}

	// Capacity for the key comes back: a resource is registered under it.
	if _, err := p.Register(adv49KeyColl, 1); err != nil {
		t.Fatalf("Register: %v", err)
	}
	select {
	case <-r.Ready():
	case <-time.After(time.Second):
		ref, _ := p.lookupKey(adv49KeyColl)
		t.Fatalf("a resource of the key was registered and its only watcher was not woken within 1s: the watcher sits on entry %d's dead life (gen %d), the key now lives on entry %d gen %d",
			r.w.key, r.w.gen, ref.idx, ref.gen)
	}
}
