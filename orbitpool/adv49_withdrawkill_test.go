package orbitpool

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// adv49: a reserver killed inside Withdraw, after its reservation's unit is
// back on the owner's resource (dropReservation) and before ungrant sets the
// owner's room bit and wakes the key, leaves the resource idle and invisible
// for good. The owner's own Acquire had found it full and cleared its room
// bit; reclaiming the dead reserver neither restores the bit nor wakes the
// waiter, so the owner cannot use its own idle resource, now or later.

var adv49KeyWithdraw = Key{Hi: 0xad49, Lo: 4}

func init() { mpMoreRoles["adv49-withdraw-killed"] = adv49RoleWithdrawKilled }

func adv49RoleWithdrawKilled(c *mpChildCtx) error {
	p, err := c.open()
	if err != nil {
		return err
	}
	l, err := p.Reserve(c.args.IDs[0])
	if err != nil {
		return err
	}
	c.send(mpMsg{Type: "reserved", Lane: p.Lane()})
	if _, err := c.expect("withdraw"); err != nil {
		return err
	}
	// Withdraw -> ungrant, verbatim, to the unit's return.
	s := p.seg
	off := s.slotOff(l.ID.Lane(), l.ID.Slot())
	if _, ok := p.claim(off, int(l.Bit), l.Ticket); !ok {
		return fmt.Errorf("ticket gone")
	}
	if !p.dropReservation(off, l.ID.Generation(), 1<<l.Bit) {
		return fmt.Errorf("bit gone")
	}
	// SIGKILL lands here, before setRoom and wake.
	c.send(mpMsg{Type: "dropped"})
	time.Sleep(time.Minute)
	return fmt.Errorf("not killed")
}

func TestAdv49KilledWithdrawHidesIdleResource(t *testing.T) {
	p, spec := mpOpenParent(t, Options{ReconcileInterval: time.Hour})
	lim := Limits{MaxResources: 1}
	id, err := p.Register(adv49KeyWithdraw, 1)
	if err != nil {
		t.Fatal(err)
	}
	c := mpStart(t, "adv49-withdraw-killed", mpArgs{Spec: spec, IDs: []ResourceID{id}, Reconcile: time.Hour, ResTimeout: time.Second, Lifetime: 30 * time.Second})
	c.expect("reserved", 5*time.Second)

	// The owner's Acquire finds its resource full (reserved), clears its
	// room bit, and waits: the budget is used up.
	res := mpAcquireAsync(p, 2*time.Second, adv49KeyWithdraw, lim)
	if _, ok := mpWaitSnap(p, 2*time.Second, func(s Snapshot) bool { return mpKS(s, adv49KeyWithdraw).Waiting == 1 }); !ok {
		t.Fatalf("the owner's Acquire never parked")
	}
	c.send(mpMsg{Type: "withdraw"})
	c.expect("dropped", 5*time.Second)
	c.kill()
	if err := p.Reconcile(); err != nil {
		t.Fatalf("Reconcile: %v", err)
	}
	// The waiter, woken by the reclaim, may have taken the resource
	// already: idle or in use, it is there and is the waiter's below.
	snap, _ := p.Snapshot()
	if ks := mpKS(snap, adv49KeyWithdraw); ks.Live != 1 || ks.Idle+ks.Busy != 1 || len(snap.Lanes) != 1 {
		t.Fatalf("after reclaim: %d lanes, key %+v; want 1 lane and the one resource", len(snap.Lanes), ks)
	}
	r := <-res
	if r.err == nil {
		r.plan.Execution.Complete()
		return
	}
	// And later, with nobody queued: still nothing.
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err2 := p.Acquire(ctx, adv49KeyWithdraw, LocalFirst{}, lim)
	t.Fatalf("the owner's only resource of the key is idle once its reserver died mid-Withdraw and was reclaimed, yet the waiting Acquire failed: %v; a fresh Acquire afterwards: %v", r.err, err2)
}
