package orbitpool

import (
	"sync/atomic"
	"testing"
	"time"
)

// TestAdv74bWatchSurvivesEntryRecycle: a process watches key A for room on a
// sibling's resource. The sibling's only resource of A goes, so A's entry is
// idle; another key needs an entry, so A's is collected and given to it; then
// A is named again (a new entry) and the sibling's resource of A gets a unit
// back. The watch, armed on A before all this and never closed, must be woken
// in bounded time: either by the unit or to be told its entry is over (the
// doc of Rearm: "Watch again then"). Asleep forever is a lost wake-up: in the
// proxy, a paused request would wait for its pause to end.
func TestAdv74bWatchSurvivesEntryRecycle(t *testing.T) {
	spec := PoolSpec{Lanes: 4, Keys: 1, ResourcesPerLane: 4}
	ps := openShared(t, spec, 2)
	a, b := ps[0], ps[1]
	A, B := Key{0x74b, 1}, Key{0x74b, 2}
	id, err := a.Register(A, 1)
	if err != nil {
		t.Fatal(err)
	}
	w, err := b.WatchRoom(A)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if err := a.Unregister(id); err != nil {
		t.Fatal(err)
	}
	// B takes A's entry (one key entry: A's must be collected).
	idB, err := a.Register(B, 1)
	if err != nil {
		t.Fatalf("register B (collecting A's idle entry): %v", err)
	}
	if err := a.Unregister(idB); err != nil {
		t.Fatal(err)
	}
	// A again, in a new life of the entry.
	if _, err := a.Register(A, 1); err != nil {
		t.Fatalf("register A again: %v", err)
	}
	useLocalOnce(t, a, A).Complete()
	if !readyWithin(w.Ready(), 2*time.Second) {
		ref, _ := a.lookupKey(A)
		t.Fatalf("watch on A armed before its entry was recycled is still asleep 2s after a sibling's unit of A came back "+
			"(A now at entry %d gen %d, watch at entry %d gen %d; watch bit of b's lane on A's entry: %v)",
			ref.idx, ref.gen, w.idx, w.gen,
			atomic.LoadUint64(a.seg.u64(a.seg.watchOff(ref.idx, b.lane)))&laneBit(b.lane) != 0)
	}
}

// TestAdv74bRearmAfterRecycleCountsNoForeignUnits: a watch of A whose entry
// was collected and given to key B must not count B's units as A's, and
// above all must not report a wrapped count (the new life's room count
// starts from 0 below what the watch saw): the proxy's relay turns every
// unit Rearm reports into a wake-up.
func TestAdv74bRearmAfterRecycleCountsNoForeignUnits(t *testing.T) {
	spec := PoolSpec{Lanes: 4, Keys: 1, ResourcesPerLane: 4}
	ps := openShared(t, spec, 3)
	a, b, c := ps[0], ps[1], ps[2]
	A, B := Key{0x74b, 3}, Key{0x74b, 4}
	id, err := a.Register(A, 1)
	if err != nil {
		t.Fatal(err)
	}
	w, err := b.WatchRoom(A)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	for range 5 {
		useLocalOnce(t, a, A).Complete()
	}
	if !readyWithin(w.Ready(), 2*time.Second) {
		t.Fatal("watch not woken by a sibling's unit")
	}
	if u := w.Rearm(); u != 5 {
		t.Fatalf("rearm after 5 units reported %d", u)
	}
	if err := a.Unregister(id); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Register(B, 1); err != nil {
		t.Fatalf("register B (collecting A's idle entry): %v", err)
	}
	wc, err := c.WatchRoom(B)
	if err != nil {
		t.Fatal(err)
	}
	defer wc.Close()
	useLocalOnce(t, a, B).Complete()
	if !readyWithin(wc.Ready(), 2*time.Second) {
		t.Fatal("c's watch of B not woken")
	}
	// b's dispatcher runs deliver every ReconcileInterval (10ms).
	time.Sleep(100 * time.Millisecond)
	if ready(w.Ready()) {
		if u := w.Rearm(); u != 0 {
			t.Fatalf("Rearm of a watch on A, whose entry went to key B, reported %d units of A (B's units, or a wrapped count)", u)
		}
	}
}
