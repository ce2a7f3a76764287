package orbitpool

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"
)

// adv49: a process killed inside checkRoom, between clearing a lane's room
// bit (its first scan found no room) and the second scan that would set it
// back, leaves the bit clear over a resource with room. Reclaiming the dead
// lane recounts the keys' budgets from the slots but not the surviving lanes'
// room bits, so the resource stays invisible: its owner's takeLocal skips its
// own list when its bit is clear, and siblings' LocalFirst walks only the
// lanes the mask names. Under a budget that the idle resource already fills,
// every Acquire of the key waits until its deadline, for good.

var adv49KeyRoom = Key{Hi: 0xad49, Lo: 1}

func init() { mpMoreRoles["adv49-room-scanner"] = adv49RoleRoomScanner }

// adv49RoleRoomScanner runs checkRoom on the parent's lane for the key, as
// roomCandidates does: its first scan is a real one, reported to the parent,
// which then gives a unit back before the scan's verdict is acted on; the
// second scan never returns, and the parent kills the process there.
func adv49RoleRoomScanner(c *mpChildCtx) error {
	p, err := c.open()
	if err != nil {
		return err
	}
	ref, ok := p.lookupKey(c.args.Key)
	if !ok {
		return fmt.Errorf("key %v not in the table", c.args.Key)
	}
	c.send(mpMsg{Type: "ready", Lane: p.Lane()})
	if _, err := c.expect("scan"); err != nil {
		return err
	}
	calls := 0
	p.checkRoom(c.args.Peer, ref.idx, func() bool {
		calls++
		if calls == 1 {
			cs, err := p.laneCandidates(c.args.Peer, ref, nil)
			room := err == nil && withUnitRoom(cs)
			n := 0
			if room {
				n = 1
			}
			c.send(mpMsg{Type: "scanned", N: n})
			if _, err := c.expect("cont"); err != nil {
				c.fail("%v", err)
			}
			return room
		}
		// The bit is clear now; the parent kills this process here.
		c.send(mpMsg{Type: "cleared"})
		time.Sleep(time.Minute)
		return false
	})
	return fmt.Errorf("checkRoom returned: the parent did not kill this process")
}

func TestAdv49RoomBitLostWhenScannerKilled(t *testing.T) {
	p, spec := mpOpenParent(t, Options{ReconcileInterval: time.Hour})
	lim := Limits{MaxResources: 1}
	if _, err := p.Register(adv49KeyRoom, 1); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	plan, err := p.Acquire(ctx, adv49KeyRoom, LocalFirst{}, lim)
	cancel()
	if err != nil || plan.Kind != PlanReuseLocal {
		t.Fatalf("first Acquire: %v %v, want a local reuse", plan.Kind, err)
	}

	c := mpStart(t, "adv49-room-scanner", mpArgs{Spec: spec, Key: adv49KeyRoom, Peer: p.Lane(), Reconcile: time.Hour, ResTimeout: time.Second, Lifetime: 30 * time.Second})
	c.expect("ready", 5*time.Second)
	c.send(mpMsg{Type: "scan"})
	if m := c.expect("scanned", 5*time.Second); m.N != 0 {
		t.Fatalf("the scanner saw room on a resource in use")
	}
	// The unit comes back while the scanner holds its "no room" verdict:
	// the bit is still set, so the owner leaves it alone.
	plan.Execution.Complete()
	ref, _ := p.lookupKey(adv49KeyRoom)
	room := p.seg.u64(p.seg.roomOff(ref.idx, p.Lane()))
	if atomic.LoadUint64(room)&laneBit(p.Lane()) == 0 {
		t.Fatalf("room bit clear right after Complete")
	}
	c.send(mpMsg{Type: "cont"})
	c.expect("cleared", 5*time.Second)
	c.kill() // SIGKILL between checkRoom's clear and its second scan

	// The survivor reconciles: the dead lane is reclaimed.
	if err := p.Reconcile(); err != nil {
		t.Fatalf("Reconcile: %v", err)
	}
	snap, err := p.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if len(snap.Lanes) != 1 {
		t.Fatalf("after Reconcile %d lanes are live, want 1 (the dead scanner's reclaimed)", len(snap.Lanes))
	}
	ks := mpKS(snap, adv49KeyRoom)
	if ks.Live != 1 || ks.Idle != 1 {
		t.Fatalf("key stats %+v, want one idle live resource", ks)
	}

	ctx, cancel = context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	plan, err = p.Acquire(ctx, adv49KeyRoom, LocalFirst{}, lim)
	if err != nil {
		t.Fatalf("the key's one resource is idle and the process that cleared its room bit is dead and reclaimed, yet Acquire found nothing (room bit %#x): %v",
			atomic.LoadUint64(room), err)
	}
	plan.Execution.Complete()
}
