package orbitpool

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

// TestAdv74bWatchedEntryIsNotCollected: a process watches key A for room on
// a sibling's resource; the sibling's only resource of A goes, so A's entry
// is idle, and another key needs an entry. A watched entry is not collected,
// as one with a waiter is not: given to the other key, it would never wake
// the watch again (in the proxy, a paused request would wait out its pause),
// and its room count, started anew, would read to the watch as units of A.
// So the other key finds the table full; a sibling's new resource of A and
// its next unit wake the watch and count as two; once the watch is closed the entry goes to
// the other key, with no watch bit and no count of A's.
func TestAdv74bWatchedEntryIsNotCollected(t *testing.T) {
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
	if _, err := a.Register(B, 1); !errors.Is(err, ErrFull) {
		t.Fatalf("register B with A's idle entry watched: %v, want ErrFull", err)
	}
	id, err = a.Register(A, 1)
	if err != nil {
		t.Fatalf("register A again: %v", err)
	}
	useLocalOnce(t, a, A).Complete()
	if !readyWithin(w.Ready(), 2*time.Second) {
		t.Fatal("watch of A not woken by a sibling's unit of A")
	}
	if u := w.Rearm(); u != 2 {
		t.Fatalf("Rearm after a resource registered with room and one unit of it reported %d, want 2", u)
	}
	idx := w.idx
	if err := a.Unregister(id); err != nil {
		t.Fatal(err)
	}
	w.Close()
	if _, err := a.Register(B, 1); err != nil {
		t.Fatalf("register B once A's watch closed: %v", err)
	}
	s := a.seg
	if m, seq := atomic.LoadUint64(s.u64(s.watchOff(idx, 0))), atomic.LoadUint64(s.u64(s.keyOff(idx)+kfRoomSeq)); m != 0 || seq != 0 {
		t.Fatalf("B's entry starts with watch mask %#x and room count %d, want none", m, seq)
	}
}

// TestAdv74bWatchOfAnEntryWhoseLifeEnded: only a corrupt segment ends a
// watched entry's life (see TestAdv74bWatchedEntryIsNotCollected); if one
// does, the watch is woken by the next pass of its dispatcher, and Rearm
// reports it over (0) rather than a count across the entry's two lives,
// which the proxy would take for that many units.
func TestAdv74bWatchOfAnEntryWhoseLifeEnded(t *testing.T) {
	ps := openShared(t, small, 2)
	a, b := ps[0], ps[1]
	A := Key{0x74b, 3}
	if _, err := a.Register(A, 1); err != nil {
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
		t.Fatalf("Rearm after 5 units reported %d", u)
	}
	s := a.seg
	ctl := s.u64(s.keyOff(w.idx) + kfCtl)
	c := atomic.LoadUint64(ctl)
	atomic.StoreUint64(ctl, keyCtl(kGen(c)+1, keyLive)|c&(1<<kStShift-1))
	atomic.StoreUint64(s.u64(s.keyOff(w.idx)+kfRoomSeq), 0)
	if !readyWithin(w.Ready(), 2*time.Second) {
		t.Fatal("a watch whose entry's life ended was not woken")
	}
	if u := w.Rearm(); u != 0 {
		t.Fatalf("Rearm of a watch whose entry's life ended reported %d units, want 0 (over)", u)
	}
}
