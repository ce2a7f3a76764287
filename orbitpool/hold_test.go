package orbitpool

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync/atomic"
	"testing"
	"time"
)

var holdKey = Key{Hi: 0x401d, Lo: 1}

const holdUnits = 3

func init() {
	mpMoreRoles["hold-owner"] = holdRoleOwner
	mpMoreRoles["hold-reclaimer"] = holdRoleReclaimer
}

// holdRoleOwner uses up holdKey's budget with resources in use, and waits to
// be killed.
func holdRoleOwner(c *mpChildCtx) error {
	p, err := c.open()
	if err != nil {
		return err
	}
	for range holdUnits {
		cp, err := p.ClaimCreate(holdKey, Limits{MaxResources: holdUnits})
		if err != nil {
			return err
		}
		if _, err := cp.RegisterAndAccept(1); err != nil {
			return err
		}
	}
	c.send(mpMsg{Type: "ready", Lane: p.Lane()})
	time.Sleep(time.Minute)
	return fmt.Errorf("not killed")
}

// holdRoleReclaimer reclaims dead lanes on command, holding their budget for
// a minute, and waits to be killed.
func holdRoleReclaimer(c *mpChildCtx) error {
	p, err := Open(c.args.Spec, Options{ReconcileInterval: time.Hour, ReclaimHold: time.Minute})
	if err != nil {
		return err
	}
	c.send(mpMsg{Type: "ready", Lane: p.Lane()})
	if _, err := c.expect("reclaim"); err != nil {
		return err
	}
	if err := p.Reconcile(); err != nil {
		return err
	}
	c.send(mpMsg{Type: "reclaimed"})
	time.Sleep(time.Minute)
	return fmt.Errorf("not killed")
}

// TestReclaimHoldKeepsDeadBudgetUntilItEnds: the budget a killed process's
// resources used stays out of the key's budget for ReclaimHold after its lane
// is reclaimed, though its resources are gone: a waiter gets it only when the
// hold ends, and is woken for it then, not at the next Reconcile. A reclaimer
// killed during its hold leaves the units to the next reclaimer, which holds
// them again.
func TestReclaimHoldKeepsDeadBudgetUntilItEnds(t *testing.T) {
	const hold = 300 * time.Millisecond
	p, spec := mpOpenParent(t, Options{ReconcileInterval: time.Hour, ReclaimHold: hold})
	lim := Limits{MaxResources: holdUnits}
	args := mpArgs{Spec: spec, Reconcile: time.Hour, ResTimeout: time.Second, Lifetime: 30 * time.Second}
	owner := mpStart(t, "hold-owner", args)
	owner.expect("ready", 5*time.Second)
	reclaimer := mpStart(t, "hold-reclaimer", args)
	reclaimer.expect("ready", 5*time.Second)

	// The reclaimer holds the dead owner's units; killed, it leaves them
	// for the parent to hold again.
	owner.kill()
	reclaimer.send(mpMsg{Type: "reclaim"})
	reclaimer.expect("reclaimed", 5*time.Second)
	snap, _ := p.Snapshot()
	if ks := mpKS(snap, holdKey); ks.Held != holdUnits || ks.Live != 0 || ks.Creating != 0 {
		t.Fatalf("after the reclaimer's reclaim: key %+v, want %d held, none live or creating", ks, holdUnits)
	}
	reclaimer.kill()

	res := mpAcquireAsync(p, 5*time.Second, holdKey, lim)
	if _, ok := mpWaitSnap(p, 2*time.Second, func(s Snapshot) bool { return mpKS(s, holdKey).Waiting == 1 }); !ok {
		t.Fatalf("the parent's Acquire never parked on the key")
	}
	start := time.Now()
	if err := p.Reconcile(); err != nil {
		t.Fatalf("Reconcile: %v", err)
	}
	snap, _ = p.Snapshot()
	if ks := mpKS(snap, holdKey); ks.Held != holdUnits || ks.Live != 0 || len(snap.Lanes) != 1 {
		t.Fatalf("after the parent's reclaim: %d lanes, key %+v; want 1 lane and %d held", len(snap.Lanes), ks, holdUnits)
	} else if snap.Lanes[0].Resources != 0 {
		t.Fatalf("the parent's lane reports %d resources; held units are none", snap.Lanes[0].Resources)
	}
	if _, err := p.ClaimCreate(holdKey, lim); !errors.Is(err, ErrBudget) {
		t.Fatalf("ClaimCreate during the hold: %v, want ErrBudget", err)
	}
	// No resource is there to be found, reserved or reused.
	if cs, err := p.Candidates(holdKey, nil); err != nil || len(cs) != 0 {
		t.Fatalf("Candidates during the hold: %v, %v; want none", cs, err)
	}

	select {
	case r := <-res:
		if r.err != nil {
			t.Fatalf("Acquire failed %v after the reclaim: %v", r.at.Sub(start).Round(time.Millisecond), r.err)
		}
		if got := r.at.Sub(start); got < hold {
			t.Fatalf("Acquire got the budget %v after the reclaim, within its %v hold", got, hold)
		}
		if r.plan.Kind != PlanCreate {
			t.Fatalf("Acquire: %v, want a creation", r.plan.Kind)
		}
		r.plan.Permit.Close()
	case <-time.After(5 * time.Second):
		t.Fatalf("Acquire did not return")
	}
	if _, ok := mpWaitSnap(p, 2*time.Second, func(s Snapshot) bool {
		ks := mpKS(s, holdKey)
		return ks.Held == 0 && ks.Live == 0 && ks.Creating == 0
	}); !ok {
		snap, _ := p.Snapshot()
		t.Fatalf("after the hold: key %+v, want nothing held", mpKS(snap, holdKey))
	}
	for range holdUnits {
		cp, err := p.ClaimCreate(holdKey, lim)
		if err != nil {
			t.Fatalf("ClaimCreate after the hold: %v", err)
		}
		defer cp.Close()
	}
}

// TestReclaimHoldOnJoin: a process that joins a fleet with a dead member
// holds the dead member's budget too (it does not reclaim the dead lane on its
// way in, which would give the budget back at once), and gives the held units
// back when it leaves during its hold.
func TestReclaimHoldOnJoin(t *testing.T) {
	p, spec := mpOpenParent(t, Options{ReconcileInterval: time.Hour})
	owner := mpStart(t, "hold-owner", mpArgs{Spec: spec, Reconcile: time.Hour, ResTimeout: time.Second, Lifetime: 30 * time.Second})
	owner.expect("ready", 5*time.Second)
	owner.kill()
	q, err := Open(spec, Options{ReconcileInterval: time.Hour, ReclaimHold: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	snap, _ := p.Snapshot()
	if ks := mpKS(snap, holdKey); ks.Held != holdUnits || len(snap.Lanes) != 2 {
		t.Fatalf("after joining: %d lanes, key %+v; want 2 lanes and %d held", len(snap.Lanes), ks, holdUnits)
	}
	if _, err := p.ClaimCreate(holdKey, Limits{MaxResources: holdUnits}); !errors.Is(err, ErrBudget) {
		t.Fatalf("ClaimCreate during the hold: %v, want ErrBudget", err)
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	snap, _ = p.Snapshot()
	if ks := mpKS(snap, holdKey); ks.Held != 0 || ks.Live != 0 || ks.Creating != 0 {
		t.Fatalf("after the holder left: key %+v, want nothing held", ks)
	}
	cp, err := p.ClaimCreate(holdKey, Limits{MaxResources: holdUnits})
	if err != nil {
		t.Fatalf("ClaimCreate after the holder left: %v", err)
	}
	cp.Close()
}

// TestReclaimHoldLastsWhileConnectionsLinger: a hold that ends while its key
// has lingering connections (SetLingering) keeps as many units as they
// number, and gives each back once it no longer lingers, within a recheck.
func TestReclaimHoldLastsWhileConnectionsLinger(t *testing.T) {
	const hold = 200 * time.Millisecond
	var lingering atomic.Int64
	var otherKey atomic.Bool
	lingering.Store(2)
	p, spec := mpOpenParent(t, Options{ReconcileInterval: time.Hour, ReclaimHold: hold})
	p.SetLingering(func(k Key) int {
		if k != holdKey {
			otherKey.Store(true)
		}
		return int(lingering.Load())
	})
	lim := Limits{MaxResources: holdUnits}
	owner := mpStart(t, "hold-owner", mpArgs{Spec: spec, Reconcile: time.Hour, ResTimeout: time.Second, Lifetime: 30 * time.Second})
	owner.expect("ready", 5*time.Second)
	owner.kill()
	start := time.Now()
	if err := p.Reconcile(); err != nil {
		t.Fatal(err)
	}
	held := func() int {
		snap, _ := p.Snapshot()
		return mpKS(snap, holdKey).Held
	}
	if n := held(); n != holdUnits {
		t.Fatalf("after the reclaim: %d held, want %d", n, holdUnits)
	}
	// The hold ends with 2 connections lingering: 1 unit goes back.
	if _, ok := mpWaitSnap(p, 2*time.Second, func(s Snapshot) bool { return mpKS(s, holdKey).Held < holdUnits }); !ok {
		t.Fatalf("nothing given back after the hold")
	}
	if d := time.Since(start); d < hold {
		t.Fatalf("a unit went back %v after the reclaim, within its %v hold", d, hold)
	}
	cp, err := p.ClaimCreate(holdKey, lim)
	if err != nil {
		t.Fatalf("ClaimCreate with 1 unit back: %v", err)
	}
	defer cp.Close()
	// Several rechecks later the two lingering connections still hold two.
	time.Sleep(3 * lingerRecheck)
	if n := held(); n != 2 {
		t.Fatalf("with 2 connections lingering, %d units held; want 2", n)
	}
	if _, err := p.ClaimCreate(holdKey, lim); !errors.Is(err, ErrBudget) {
		t.Fatalf("ClaimCreate while 2 linger: %v, want ErrBudget", err)
	}
	lingering.Store(1)
	if _, ok := mpWaitSnap(p, time.Second, func(s Snapshot) bool { return mpKS(s, holdKey).Held == 1 }); !ok {
		t.Fatalf("a connection stopped lingering; %d units still held, want 1", held())
	}
	lingering.Store(-1) // unknown: the hold is a time again, and it has passed
	if _, ok := mpWaitSnap(p, time.Second, func(s Snapshot) bool { return mpKS(s, holdKey).Held == 0 }); !ok {
		t.Fatalf("no lingering known; %d units still held, want none", held())
	}
	for range holdUnits - 1 {
		cp, err := p.ClaimCreate(holdKey, lim)
		if err != nil {
			t.Fatalf("ClaimCreate after the hold: %v", err)
		}
		defer cp.Close()
	}
	if otherKey.Load() {
		t.Fatalf("Lingering asked about a key nothing was held for")
	}
}

// TestExiting: a running process is not done exiting; a killed one is once
// it is a zombie, and once reaped.
func TestExiting(t *testing.T) {
	if !exiting(os.Getpid()) {
		t.Fatalf("this process reads as done exiting")
	}
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	pid := cmd.Process.Pid
	if !exiting(pid) {
		t.Fatalf("a running child reads as done exiting")
	}
	cmd.Process.Kill()
	deadline := time.Now().Add(5 * time.Second)
	for exiting(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("a killed child, not reaped, still reads as exiting after 5s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	cmd.Wait()
	if exiting(pid) || exiting(0) {
		t.Fatalf("a reaped child, or pid 0, reads as exiting")
	}
}

// TestReclaimHoldForLingeringEndsWhenTheHolderLeaves: a holder that leaves
// while it keeps units on for lingering connections, past its set hold,
// gives them back to the fleet as it would during the set time, and asks no
// more about lingering once closed.
func TestReclaimHoldForLingeringEndsWhenTheHolderLeaves(t *testing.T) {
	const hold = 100 * time.Millisecond
	p, spec := mpOpenParent(t, Options{ReconcileInterval: time.Hour})
	owner := mpStart(t, "hold-owner", mpArgs{Spec: spec, Reconcile: time.Hour, ResTimeout: time.Second, Lifetime: 30 * time.Second})
	owner.expect("ready", 5*time.Second)
	q, err := Open(spec, Options{ReconcileInterval: time.Hour, ReclaimHold: hold})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	var asked atomic.Int64
	q.SetLingering(func(Key) int {
		asked.Add(1)
		return holdUnits
	})
	owner.kill()
	if err := q.Reconcile(); err != nil {
		t.Fatal(err)
	}
	held := func() KeyStats {
		snap, _ := p.Snapshot()
		return mpKS(snap, holdKey)
	}
	time.Sleep(hold + 3*lingerRecheck)
	if ks := held(); ks.Held != holdUnits || asked.Load() == 0 {
		t.Fatalf("past the set hold with %d lingering: key %+v, lingering asked %d times; want %d held", holdUnits, ks, asked.Load(), holdUnits)
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	if ks := held(); ks.Held != 0 || ks.Live != 0 || ks.Creating != 0 {
		t.Fatalf("after the holder left: key %+v, want nothing held", ks)
	}
	for range holdUnits {
		cp, err := p.ClaimCreate(holdKey, Limits{MaxResources: holdUnits})
		if err != nil {
			t.Fatalf("ClaimCreate after the holder left: %v", err)
		}
		defer cp.Close()
	}
	n := asked.Load()
	time.Sleep(3 * lingerRecheck)
	if m := asked.Load(); m != n {
		t.Fatalf("lingering asked %d more times after Close", m-n)
	}
}
