package orbitpool

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"
)

// adv53: recount wakes for the returning marks a dead Unregister left. In the
// first version it took the marks (swapped the counts to zero, cleared the
// slots' bits) at the start of its lane loop and woke for them only at its
// end: a reclaimer killed in between (a survivor in Reconcile, a joiner, a
// process in its own Close) destroyed the only record of the unit and woke
// no one, and the next reclaim found the counters right and no mark. The
// marks are now dropped only after the wake-ups.

var adv53KeyReclaim = Key{Hi: 0xad53, Lo: 1}

func init() { mpMoreRoles["adv53-reclaimer-killed"] = adv53RoleReclaimerKilled }

// adv53RoleReclaimerKilled joins, and on command reclaims the given dead
// lane as reclaimLane does, verbatim, up to the end of recount's lane loop
// (the marks counted, nothing yet woken), where the parent kills it.
func adv53RoleReclaimerKilled(c *mpChildCtx) error {
	p, err := c.open()
	if err != nil {
		return err
	}
	c.send(mpMsg{Type: "ready", Lane: p.Lane()})
	m, err := c.expect("reclaim")
	if err != nil {
		return err
	}
	s := p.seg
	if err := s.lockStructure(); err != nil {
		return err
	}
	dead := m.Lane
	if alive, err := s.laneAlive(dead); err != nil || alive {
		return fmt.Errorf("lane %d alive %v: %v", dead, alive, err)
	}
	// reclaimLane: p.recount(p.clearLane(l)), recount's first loop.
	_ = p.clearLane(dead)
	returning := make([]int, p.l.nkeys)
	for l := range p.l.nlanes {
		if lnState(atomic.LoadUint64(s.u64(s.laneOff(l)+lnCtl))) != laneLive {
			continue
		}
		p.countReturning(l, returning)
	}
	// SIGKILL lands here, in recount, before the key loop's wake-ups.
	n := 0
	for _, r := range returning {
		n += r
	}
	c.send(mpMsg{Type: "dropped", N: n})
	time.Sleep(time.Minute)
	return fmt.Errorf("not killed")
}

func TestAdv53ReclaimerKilledMidRecountLosesMarks(t *testing.T) {
	p, spec := mpOpenParent(t, Options{ReconcileInterval: time.Hour})
	lim := Limits{MaxResources: 1}
	args := mpArgs{Spec: spec, Key: adv53KeyReclaim, Reconcile: time.Hour, ResTimeout: time.Second, Lifetime: 30 * time.Second}
	d := mpStart(t, "adv49-unregister-killed", args)
	dm := d.expect("ready", 5*time.Second)
	r := mpStart(t, "adv53-reclaimer-killed", args)
	r.expect("ready", 5*time.Second)

	res := mpAcquireAsync(p, 4*time.Second, adv53KeyReclaim, lim)
	if _, ok := mpWaitSnap(p, 2*time.Second, func(s Snapshot) bool { return mpKS(s, adv53KeyReclaim).Waiting == 1 }); !ok {
		t.Fatalf("the parent's Acquire never parked on the key")
	}

	// The owner dies between keyRelease and its wake-up: its slot carries
	// the returning mark.
	d.send(mpMsg{Type: "unregister"})
	d.expect("released", 5*time.Second)
	d.kill()

	// A survivor starts reclaiming it and dies after taking the marks.
	r.send(mpMsg{Type: "reclaim", Lane: dm.Lane})
	rm := r.expect("dropped", 5*time.Second)
	if rm.N != 1 {
		t.Fatalf("the reclaimer took %d marks, want 1 (the dead Unregister's)", rm.N)
	}
	r.kill()

	start := time.Now()
	if err := p.Reconcile(); err != nil {
		t.Fatalf("Reconcile: %v", err)
	}
	snap, _ := p.Snapshot()
	if ks := mpKS(snap, adv53KeyReclaim); ks.Live != 0 || ks.Creating > 1 || len(snap.Lanes) != 1 {
		t.Fatalf("after reclaim: %d lanes, key %+v; want 1 lane and an empty budget", len(snap.Lanes), ks)
	}
	select {
	case r := <-res:
		if r.err != nil {
			t.Fatalf("the key's budget is free since both dead lanes were reclaimed, yet the waiter was never woken: Acquire failed %v later: %v", r.at.Sub(start).Round(time.Millisecond), r.err)
		}
		if r.plan.Kind != PlanCreate {
			t.Fatalf("Acquire: %v, want a creation", r.plan.Kind)
		}
		r.plan.Permit.Close()
	case <-time.After(6 * time.Second):
		t.Fatalf("Acquire did not return")
	}
}
