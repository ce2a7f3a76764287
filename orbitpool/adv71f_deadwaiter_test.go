package orbitpool

import (
	"context"
	"errors"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

func init() { mpMoreRoles["adv71f-empty-waiter"] = adv71fRoleEmptyWaiter }

// adv71fRoleEmptyWaiter parks one waiter on args.Key, which has no resources
// (adv71fWaitEmpty), reports "parked" with its lane, and stays.
func adv71fRoleEmptyWaiter(c *mpChildCtx) error {
	p, err := c.open()
	if err != nil {
		return err
	}
	defer p.Close()
	go p.Acquire(context.Background(), c.args.Key, adv71fWaitEmpty{}, Limits{})
	s := p.seg
	for end := time.Now().Add(20 * time.Second); ; time.Sleep(time.Millisecond) {
		if ref, ok := p.lookupKey(c.args.Key); ok && qWaiting(atomic.LoadUint64(s.u64(s.queueOff(p.Lane(), ref.idx)))) == 1 {
			break
		}
		if time.Now().After(end) {
			return errors.New("never parked")
		}
	}
	c.send(mpMsg{Type: "parked", Lane: p.Lane()})
	c.untilParentLeaves()
	return nil
}

// TestAdv71fCollectKeepsDeadUnreclaimedWaiterBit: a process (its lane 66, in
// the second mask word) parks a waiter on a key with no resources and is
// SIGKILLed. Until its lane is reclaimed, its waiter bit is not a stray (the
// lane record is live): a collection forced by a full table must leave the
// key's entry alone (clearStrayWaiters must not clear the bit of a dead but
// unreclaimed lane, whose reclaim hands its units on). Once a Reconcile
// reclaims the lane, the bit is gone and the entry is collectable.
func TestAdv71fCollectKeepsDeadUnreclaimedWaiterBit(t *testing.T) {
	dir := t.TempDir()
	spec := PoolSpec{Path: filepath.Join(dir, "seg"), Lanes: 70, Keys: 2, ResourcesPerLane: 2}
	var errs atomic.Int64
	opts := Options{ReconcileInterval: time.Hour, ReservationTimeout: time.Hour, OnError: func(error) { errs.Add(1) }}
	open := opener(t, spec, opts)
	var ps []*Pool
	for range 66 {
		ps = append(ps, open())
	}
	p := ps[0]
	k := Key{0xad71f, 60}
	child := mpStart(t, "adv71f-empty-waiter", mpArgs{Spec: spec, Reconcile: time.Hour, ResTimeout: time.Hour, Key: k, Lifetime: time.Minute})
	m := child.expect("parked", 30*time.Second)
	if m.Lane != 66 {
		t.Fatalf("child on lane %d", m.Lane)
	}
	child.cmd.Process.Kill()
	select {
	case <-child.done:
	case <-time.After(10 * time.Second):
		t.Fatal("child not dead")
	}
	ref, ok := p.lookupKey(k)
	if !ok {
		t.Fatal("key not found")
	}
	s := p.seg
	id2, err := p.Register(Key{0xad71f, 61}, 1)
	if err == nil {
		err = p.Unregister(id2)
	}
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Register(Key{0xad71f, 62}, 1); err != nil {
		t.Fatalf("third key: %v", err)
	}
	c := atomic.LoadUint64(s.u64(s.keyOff(ref.idx) + kfCtl))
	if kState(c) != keyLive || kGen(c) != ref.gen {
		t.Fatalf("the dead, unreclaimed lane's waiter key entry was collected (state %d gen %d, was %d)", kState(c), kGen(c), ref.gen)
	}
	if atomic.LoadUint64(s.u64(s.maskOff(ref.idx, 66)))&laneBit(66) == 0 {
		t.Fatal("the dead, unreclaimed lane's waiter bit was cleared as a stray")
	}
	if n := errs.Load(); n != 0 {
		t.Errorf("%d ErrCorrupt reports for a sound segment", n)
	}
	// The reclaim clears it; then the entry is collectable.
	if err := p.Reconcile(); err != nil {
		t.Fatal(err)
	}
	if atomic.LoadUint64(s.u64(s.maskOff(ref.idx, 66)))&laneBit(66) != 0 {
		t.Fatal("the reclaim left the dead lane's waiter bit")
	}
	if _, err := p.Register(Key{0xad71f, 63}, 1); err != nil {
		t.Fatalf("a key after the reclaim freed k's entry: %v", err)
	}
}
