package orbitpool

import (
	"sync/atomic"
	"testing"
	"time"
)

// TestAdv76aStaleWatchRefSparesOtherKeysWatch: WatchRoom looks its key up
// without a lock (onKey → internKey → lookupKey) and only then takes the
// watch table's mutex. Between the two, key A's entry may be collected and
// given to key B, which this process may already watch. The late add for A
// must then fail with errKeyGone (and onKey look A up again), as the waiter
// table's register does (wait.go: "It is the caller's reference that is out
// of date"), and leave the process's watch of B alone: armed, its lane's bit
// in B's watch mask set, and woken by B's next unit from a sibling.
//
// The interleaving is made certain by calling the watch table's add with the
// reference A had before its entry was reused, exactly what a WatchRoom(A)
// preempted after its look-up passes.
func TestAdv76aStaleWatchRefSparesOtherKeysWatch(t *testing.T) {
	ps := openShared(t, PoolSpec{Lanes: 4, Keys: 1, ResourcesPerLane: 2}, 2)
	a, b := ps[0], ps[1]
	kA, kB := Key{0xa76, 1}, Key{0xa76, 2}

	refA, err := a.internKey(kA)
	if err != nil {
		t.Fatal(err)
	}
	// The one-entry table is full: naming B collects A (no resources, no
	// waiters, no watches) and gives B the same entry, one generation on.
	if _, err := b.Register(kB, 1); err != nil {
		t.Fatal(err)
	}
	refB, ok := a.lookupKey(kB)
	if !ok || refB.idx != refA.idx || refB.gen == refA.gen {
		t.Fatalf("setup: B's entry %+v, A's old one %+v: want the same entry in a new life", refB, refA)
	}
	wB, err := a.WatchRoom(kB)
	if err != nil {
		t.Fatal(err)
	}
	defer wB.Close()
	exec, err := b.Acquire(t.Context(), kB, LocalOnly{}, Limits{})
	if err != nil || exec.Execution == nil {
		t.Fatalf("b's local use of B: %v", err)
	}

	// The late half of a WatchRoom(A) whose look-up ran before the reuse.
	s := a.seg
	bit := func() bool {
		return atomic.LoadUint64(s.u64(s.watchOff(refB.idx, a.lane)))&laneBit(a.lane) != 0
	}
	wA, err := a.watches.add(a, refA)
	if err != errKeyGone {
		t.Errorf("add with A's stale reference: %v, %v; want errKeyGone", wA, err)
	}
	if ready(wB.Ready()) {
		t.Errorf("a's watch of key B was woken by a stale WatchRoom of key A; no unit of B came back")
	}
	if !bit() {
		t.Errorf("a's watch bit on B's entry was cleared by a stale WatchRoom of key A while a's watch of B is open: B's entry may now be collected under it")
	}
	if got := a.watches.n.Load(); got != 1 {
		t.Errorf("a's watch count after the stale add: %d, want 1 (the watch of B)", got)
	}
	// The watch of B must still work: after Rearm (if it fired) a unit of B
	// coming back on b's resource must wake it.
	if ready(wB.Ready()) {
		wB.Rearm()
		if ready(wB.Ready()) {
			t.Errorf("a's watch of B, rearmed, is still ready: Rearm refused it (its entry is live, in the life it was armed in)")
		}
	}
	exec.Execution.Complete()
	if !readyWithin(wB.Ready(), 2*time.Second) {
		t.Errorf("a's watch of B not woken by b's unit of B coming back")
	}
}
