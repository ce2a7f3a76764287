package orbitpool

import (
	"context"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"
)

func ready(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func readyWithin(ch <-chan struct{}, d time.Duration) bool {
	select {
	case <-ch:
		return true
	case <-time.After(d):
		return false
	}
}

// useLocalOnce takes p's resource of k, which must have room, for one use.
func useLocalOnce(t *testing.T, p *Pool, k Key) *Execution {
	t.Helper()
	plan, err := p.Acquire(context.Background(), k, LocalOnly{}, Limits{})
	if err != nil || plan.Kind != PlanReuseLocal {
		t.Fatalf("local use: %v %v", plan.Kind, err)
	}
	return plan.Execution
}

// TestRoomWatch: a watch is woken when a sibling's resource of its key gets a
// unit back after it was armed (the use ending, the capacity raised), not by
// its own process's units nor by another key's; Rearm arms it again; the
// last Close takes the lane's bit out of the key's watch mask, after which
// units given back cost no count; a closing pool wakes its watches.
func TestRoomWatch(t *testing.T) {
	ps := openShared(t, small, 2)
	a, b := ps[0], ps[1]
	k, other := Key{1, 1}, Key{2, 2}
	id, err := a.Register(k, 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Register(other, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Register(k, 1); err != nil {
		t.Fatal(err)
	}
	exec := useLocalOnce(t, a, k)
	w, err := b.WatchRoom(k)
	if err != nil {
		t.Fatal(err)
	}
	useLocalOnce(t, a, other).Complete()
	useLocalOnce(t, b, k).Complete()
	if readyWithin(w.Ready(), 50*time.Millisecond) {
		t.Fatal("woken by another key's unit, or by its own process's")
	}
	exec.Complete()
	if !readyWithin(w.Ready(), 5*time.Second) {
		t.Fatal("a sibling's unit came back and the watch was not woken")
	}
	w.Rearm()
	if ready(w.Ready()) {
		t.Fatal("rearmed watch ready before any unit came back")
	}
	exec = useLocalOnce(t, a, k)
	if err := a.SetCapacity(id, 2); err != nil {
		t.Fatal(err)
	}
	if !readyWithin(w.Ready(), 5*time.Second) {
		t.Fatal("a sibling's resource got room for another use and the watch was not woken")
	}
	w.Rearm()

	// Two watches of the key: the bit stays until the last goes.
	w2, err := b.WatchRoom(k)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := b.internKey(k)
	if err != nil {
		t.Fatal(err)
	}
	s := b.seg
	bit := func() bool { return atomic.LoadUint64(s.u64(s.watchOff(ref.idx, b.lane)))&laneBit(b.lane) != 0 }
	seq := func() uint64 { return atomic.LoadUint64(s.u64(s.keyOff(ref.idx) + kfRoomSeq)) }
	w.Close()
	w.Close() // twice is harmless
	if !bit() {
		t.Fatal("the key's watch bit went with the first of two watches")
	}
	w2.Close()
	if bit() {
		t.Fatal("the key's watch bit outlived its last watch")
	}
	before := seq()
	exec.Complete()
	if seq() != before {
		t.Fatal("a unit given back with no watch counted")
	}

	w3, err := b.WatchRoom(k)
	if err != nil {
		t.Fatal(err)
	}
	b.Close()
	if !ready(w3.Ready()) {
		t.Fatal("a closed pool's watch is not woken")
	}
	if _, err := b.WatchRoom(k); err != ErrClosed {
		t.Fatalf("watch on a closed pool: %v, want ErrClosed", err)
	}
}

// TestRoomWatchLosesNoWake: a unit that comes back at any moment around the
// arming of a watch is either seen by the look that follows the arming or
// wakes the watch. Each round a sibling gives its resource's one unit back
// at a random instant while the watcher arms (or rearms) and then looks.
func TestRoomWatchLosesNoWake(t *testing.T) {
	ps := openShared(t, small, 2)
	a, b := ps[0], ps[1]
	k := Key{3, 3}
	if _, err := a.Register(k, 1); err != nil {
		t.Fatal(err)
	}
	w, err := b.WatchRoom(k)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	room := func() bool {
		cs, err := b.Candidates(k, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range cs {
			if !c.Local && c.Capacity-c.InUse-c.Pending > 0 {
				return true
			}
		}
		return false
	}
	seen, woken := 0, 0
	for round := range 2000 {
		exec := useLocalOnce(t, a, k)
		start, done := make(chan struct{}), make(chan struct{})
		go func() {
			<-start
			spin(rand.N(4000))
			exec.Complete()
			close(done)
		}()
		close(start)
		spin(rand.N(16000))
		if round%2 == 0 {
			w.Close()
			if w, err = b.WatchRoom(k); err != nil {
				t.Fatal(err)
			}
		} else {
			w.Rearm()
		}
		switch {
		case room():
			seen++
		case readyWithin(w.Ready(), 5*time.Second):
			woken++
		default:
			t.Fatalf("round %d: the unit came back after the watch was armed, the look after it saw no room, and the watch was not woken", round)
		}
		<-done
	}
	if seen == 0 || woken == 0 {
		t.Logf("the unit came back before the arming in %d rounds, after it in %d: one order was not tried", seen, woken)
	}
	t.Logf("seen by the look %d, woken %d", seen, woken)
}

func spin(n int) {
	for range n {
		_ = rand.N(2)
	}
}

// TestWithdrawWakesOwnersWatch: a watches key K (its own requests wait for
// room) and b reserves a's one resource of K, then withdraws: the unit comes
// back on a's resource, but in b's process. Nothing but the watch tells a of
// it, so a's watch must be woken.
func TestWithdrawWakesOwnersWatch(t *testing.T) {
	ps := openShared(t, PoolSpec{Lanes: 4, Keys: 4, ResourcesPerLane: 2}, 2)
	a, b := ps[0], ps[1]
	k := Key{0x75, 1}
	id, err := a.Register(k, 1)
	if err != nil {
		t.Fatal(err)
	}
	wa, err := a.WatchRoom(k)
	if err != nil {
		t.Fatal(err)
	}
	defer wa.Close()
	l, err := b.Reserve(id)
	if err != nil {
		t.Fatal(err)
	}
	b.Withdraw(l)
	if !readyWithin(wa.Ready(), 2*time.Second) {
		t.Fatal("a's watch not woken within 2s by the unit b withdrew on a's resource")
	}
}
