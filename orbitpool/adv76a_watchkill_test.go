package orbitpool

import (
	"errors"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func init() { mpMoreRoles["adv76a-watcher"] = adv76aRoleWatcher }

// adv76aRoleWatcher watches c.args.Key with two watches and waits to be
// killed, reporting each wake-up.
func adv76aRoleWatcher(c *mpChildCtx) error {
	p, err := c.open()
	if err != nil {
		return err
	}
	var ws []*RoomWatch
	for range 2 {
		w, err := p.WatchRoom(c.args.Key)
		if err != nil {
			return err
		}
		ws = append(ws, w)
	}
	c.send(mpMsg{Type: "ready", Lane: p.Lane()})
	for {
		select {
		case <-ws[0].Ready():
			c.send(mpMsg{Type: "woken"})
			ws[0].Rearm()
		case _, ok := <-c.cmds:
			if !ok {
				return nil
			}
		}
	}
}

// TestAdv76aKilledWatcherHoldsNoEntry: a process watching key A in a
// one-entry table holds A's entry (a watched entry is not collected, see
// doc.go), so a sibling naming key B is refused with ErrFull; a surviving
// watcher of A in a third process is still woken for A's units after the
// watching process is SIGKILLed (its watch bit, shared word with the
// survivor's, is cleared without clearing the survivor's); and once the
// survivor closes its watch, the dead process's watch bit holds the entry no
// more: B can be named, in A's entry, and a new watch of B is woken by B's
// units, never by anything left of A.
// (Without any Reconcile of the dead lane, naming B is refused with ErrFull:
// clearStrayWaiters leaves the bits of a lane whose record says live, as the
// dead lane's resources would hold the entry too, until the next Reconcile
// reclaims it. By design, not asserted here.)
func TestAdv76aKilledWatcherHoldsNoEntry(t *testing.T) {
	spec := PoolSpec{Lanes: 4, Keys: 1, ResourcesPerLane: 2, Path: filepath.Join(t.TempDir(), "seg")}
	opts := Options{ReconcileInterval: time.Hour, ReservationTimeout: time.Second}
	open := opener(t, spec, opts)
	owner, survivor := open(), open()
	kA, kB := Key{0xa76b, 1}, Key{0xa76b, 2}
	c := mpStart(t, "adv76a-watcher", mpArgs{Spec: spec, Key: kA, Reconcile: time.Hour, ResTimeout: time.Second, Lifetime: 30 * time.Second})
	c.expect("ready", 10*time.Second)

	if _, err := owner.Register(kB, 1); !errors.Is(err, ErrFull) {
		t.Fatalf("naming B while a sibling watches A in a one-entry table: %v, want ErrFull", err)
	}
	ws, err := survivor.WatchRoom(kA)
	if err != nil {
		t.Fatal(err)
	}
	idA, err := owner.Register(kA, 1)
	if err != nil {
		t.Fatal(err)
	}
	// The child is woken by the unit the registration gave (a sibling's
	// resource got room); drain that.
	c.expect("woken", 5*time.Second)
	ws.Rearm()
	exec, err := owner.Acquire(t.Context(), kA, LocalOnly{}, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	c.kill()
	exec.Execution.Complete()
	if !readyWithin(ws.Ready(), 2*time.Second) {
		t.Fatalf("the surviving watcher of A was not woken by A's unit after the other watcher was killed")
	}
	if err := survivor.Reconcile(); err != nil {
		t.Fatal(err)
	}
	ref, _ := survivor.lookupKey(kA)
	s := survivor.seg
	if atomic.LoadUint64(s.u64(s.watchOff(ref.idx, survivor.lane)))&laneBit(survivor.lane) == 0 {
		t.Errorf("the reclaim of the killed watcher's lane cleared the survivor's watch bit")
	}
	ws.Close()
	if err := owner.Unregister(idA); err != nil {
		t.Fatal(err)
	}
	idB, err := owner.Register(kB, 1)
	if err != nil {
		t.Fatalf("naming B after every watcher of A is gone (one killed, one closed): %v", err)
	}
	wB, err := survivor.WatchRoom(kB)
	if err != nil {
		t.Fatal(err)
	}
	defer wB.Close()
	if readyWithin(wB.Ready(), 50*time.Millisecond) {
		t.Errorf("a new watch of B is ready with no unit of B back")
	}
	exec, err = owner.Acquire(t.Context(), kB, LocalOnly{}, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	exec.Execution.Complete()
	if !readyWithin(wB.Ready(), 2*time.Second) {
		t.Errorf("the watch of B, in A's old entry, not woken by B's unit")
	}
	_ = idB
}

// TestAdv76aCloseUnderRinging: pools with armed watches of a key close while
// a sibling gives units of the key back as fast as it can, and while another
// sibling reserves and withdraws on the ringing owner's resource. No panic;
// every closed pool's watches are woken; the closed lanes' watch bits are
// gone (the key is held by the one surviving watcher only); the surviving
// watcher keeps being woken; and the owner's resource has every unit back.
func TestAdv76aCloseUnderRinging(t *testing.T) {
	spec := PoolSpec{Lanes: 8, Keys: 2, ResourcesPerLane: 2, Path: filepath.Join(t.TempDir(), "seg")}
	open := opener(t, spec, Options{ReconcileInterval: 10 * time.Millisecond, ReservationTimeout: 50 * time.Millisecond})
	owner, reserver, survivor := open(), open(), open()
	k := Key{0xa76c, 1}
	id, err := owner.Register(k, 2)
	if err != nil {
		t.Fatal(err)
	}
	sw, err := survivor.WatchRoom(k)
	if err != nil {
		t.Fatal(err)
	}
	defer sw.Close()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { // the owner rings
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if plan, err := owner.Acquire(t.Context(), k, LocalOnly{}, Limits{}); err == nil {
				plan.Execution.Complete()
			}
		}
	}()
	go func() { // a sibling reserves and withdraws on the owner's resource
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if l, err := reserver.Reserve(id); err == nil {
				reserver.Withdraw(l)
			}
		}
	}()
	for round := range 20 {
		cl := open()
		var ws []*RoomWatch
		for range 3 {
			w, err := cl.WatchRoom(k)
			if err != nil {
				t.Fatalf("round %d: WatchRoom: %v", round, err)
			}
			ws = append(ws, w)
		}
		ws[0].Close()
		lane := cl.Lane()
		if err := cl.Close(); err != nil {
			t.Fatalf("round %d: Close: %v", round, err)
		}
		for i, w := range ws[1:] {
			if !ready(w.Ready()) {
				t.Errorf("round %d: watch %d of the closed pool not woken", round, i+1)
			}
			if w.Rearm() != 0 || !ready(w.Ready()) {
				t.Errorf("round %d: watch %d of a closed pool rearmed", round, i+1)
			}
			w.Close()
		}
		ref, ok := survivor.lookupKey(k)
		if !ok {
			t.Fatal("key gone")
		}
		s := survivor.seg
		if atomic.LoadUint64(s.u64(s.watchOff(ref.idx, lane)))&laneBit(lane) != 0 && lnState(atomic.LoadUint64(s.u64(s.laneOff(lane)+lnCtl))) != laneLive {
			t.Errorf("round %d: closed lane %d left its watch bit on the key", round, lane)
		}
	}
	// The survivor is still woken.
	sw.Rearm()
	if !readyWithin(sw.Ready(), 2*time.Second) {
		t.Errorf("the surviving watcher is no longer woken while the owner gives units back")
	}
	close(stop)
	wg.Wait()
	deadline := time.Now().Add(2 * time.Second)
	for {
		n, err := owner.Users(id)
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("owner's resource has %d users/reservations 2s after all stopped", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
