package orbitpool

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"
)

// adv53: claimCreate moves a free slot's returning mark to the lane's count
// while the unregistering goroutine's returned, which runs without laneMu,
// may be clearing it. In the first version the move cleared the bit and
// then counted it, and returned, finding the bit gone between the two,
// took one from a count of 0: a process killed there left 0xffffffff, and
// the reclaim woke the key for 65536 units, letting a younger waiter pass
// the oldest through the surplus (unclaimed units). The move now counts
// first and clears second, so returned only ever takes back a mark that was
// counted.

var adv53KeyUnderflow = Key{Hi: 0xad53, Lo: 2}

func init() { mpMoreRoles["adv53-underflow-killed"] = adv53RoleUnderflowKilled }

// adv53RoleUnderflowKilled owns one resource of the key and on command runs,
// verbatim, an Unregister of it (goroutine U) interleaved with a Register of
// a new resource of the same key (goroutine C, claimCreate with force) that
// takes the freed slot: U frees the slot with the mark, gives the unit back
// and wakes; C claims, pops the slot and moves the mark to the count; U's
// returned finds the bit gone and takes it from the count; SIGKILL.
func adv53RoleUnderflowKilled(c *mpChildCtx) error {
	p, err := c.open()
	if err != nil {
		return err
	}
	cp, err := p.ClaimCreate(c.args.Key, Limits{MaxResources: 1})
	if err != nil {
		return err
	}
	id, err := cp.Register(1)
	if err != nil {
		return err
	}
	c.send(mpMsg{Type: "ready", Lane: p.Lane(), IDs: []ResourceID{id}})
	if _, err := c.expect("go"); err != nil {
		return err
	}
	s := p.seg
	// U: unregister, to its wake-up.
	off, freed, k, kg, err := unregisterToRelease(p, id)
	if err != nil {
		return err
	}
	p.keyRelease(k, kg, false)
	if p.queued(k) {
		p.grant(k, 1, -1)
	}
	// C: Register's claimCreate(ref, Limits{}, true, -1), to the mark's move.
	if err := p.rlockOpen(); err != nil {
		return err
	}
	ref := keyRef{idx: k, gen: kg}
	if err := p.keyClaim(ref, Limits{}, true, -1); err != nil {
		return err
	}
	p.laneMu.Lock()
	slot := int(p.free[len(p.free)-1])
	p.free = p.free[:len(p.free)-1]
	off2 := s.slotOff(p.lane, slot)
	w2 := atomic.LoadUint64(s.u64(off2 + slWord))
	moved := false
	if w2&slReturning != 0 {
		if k2, _, ok := p.slotKey(off2); ok {
			ret := s.u32(s.returningOff(p.lane, k2))
			atomic.AddUint32(ret, 1)
			if atomic.CompareAndSwapUint64(s.u64(off2+slWord), w2, w2&^slReturning) {
				moved = true
			} else {
				atomic.AddUint32(ret, ^uint32(0))
			}
		}
	}
	// U: returned, right after C's move.
	p.returned(off, freed, k)
	// SIGKILL lands here, before C overwrites the slot's word.
	c.send(mpMsg{Type: "dying", N: int(atomic.LoadUint32(s.u32(s.returningOff(p.lane, k)))), Kind: PlanKind(btoi(moved && off2 == off))})
	time.Sleep(time.Minute)
	return fmt.Errorf("not killed")
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

func TestAdv53KilledMidMarkMoveWakesForThousands(t *testing.T) {
	p, spec := mpOpenParent(t, Options{ReconcileInterval: time.Hour})
	lim := Limits{MaxResources: 1}
	c := mpStart(t, "adv53-underflow-killed", mpArgs{Spec: spec, Key: adv53KeyUnderflow, Reconcile: time.Hour, ResTimeout: time.Second, Lifetime: 30 * time.Second})
	c.expect("ready", 5*time.Second)
	c.send(mpMsg{Type: "go"})
	m := c.expect("dying", 5*time.Second)
	if m.Kind != 1 {
		t.Fatalf("the child's claimCreate did not take the marked slot")
	}
	if n := uint32(m.N); n != 0 {
		t.Fatalf("dead lane's returning count for the key: %#x after the mark moved and returned took it, want 0", n)
	}
	c.kill()

	// Two waiters: the key's budget is held by the dead child's claim.
	r1 := mpAcquireAsync(p, 4*time.Second, adv53KeyUnderflow, lim)
	if _, ok := mpWaitSnap(p, 2*time.Second, func(s Snapshot) bool { return mpKS(s, adv53KeyUnderflow).Waiting == 1 }); !ok {
		t.Fatalf("the first Acquire never parked on the key")
	}
	r2 := mpAcquireAsync(p, 4*time.Second, adv53KeyUnderflow, lim)
	if _, ok := mpWaitSnap(p, 2*time.Second, func(s Snapshot) bool { return mpKS(s, adv53KeyUnderflow).Waiting == 2 }); !ok {
		t.Fatalf("the second Acquire never parked on the key")
	}
	if err := p.Reconcile(); err != nil {
		t.Fatalf("Reconcile: %v", err)
	}
	ref, ok := p.lookupKey(adv53KeyUnderflow)
	if !ok {
		t.Fatalf("key gone")
	}
	unclaimed := atomic.LoadUint64(p.seg.u64(p.seg.keyOff(ref.idx) + kfUnclaimed))
	// One unit came back (the dead claim): it is the oldest waiter's.
	select {
	case r := <-r1:
		if r.err != nil || r.plan.Kind != PlanCreate {
			t.Fatalf("oldest waiter: %v %v, want a creation", r.plan.Kind, r.err)
		}
		r.plan.Permit.Close()
	case r := <-r2:
		if r.plan.Permit != nil {
			r.plan.Permit.Close()
		}
		t.Fatalf("the one unit the reclaim gave back went to the younger waiter (%v %v) ahead of the oldest: the reclaim woke the key for %d units more than it had waiters, and the younger waiter, behind the oldest's grant, took one of them as unclaimed", r.plan.Kind, r.err, unclaimed)
	case <-time.After(3 * time.Second):
		t.Fatalf("no waiter was woken by the reclaim (unclaimed %d)", unclaimed)
	}
	if unclaimed > 1 {
		t.Errorf("the reclaim of a lane that died with one creation claim woke the key for %d units more than its waiters", unclaimed)
	}
	<-r2
}
