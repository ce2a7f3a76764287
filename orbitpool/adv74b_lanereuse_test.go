package orbitpool

import (
	"sync/atomic"
	"testing"
	"time"
)

// TestAdv74bWatcherDiesLaneReused: a process dies with a watch armed, and a
// new process at once takes its lane (before any survivor's reclaim runs on
// its own). The new process must not inherit the watch bit (units given back
// would count and ring it for nobody), and its own watch of the key must
// work: woken by a sibling's unit, and its bit gone with its Close.
func TestAdv74bWatcherDiesLaneReused(t *testing.T) {
	spec := PoolSpec{Lanes: 2, Keys: 4, ResourcesPerLane: 2}
	ps := openShared(t, spec, 2)
	a, b := ps[0], ps[1]
	k := Key{0x74b, 9}
	if _, err := a.Register(k, 1); err != nil {
		t.Fatal(err)
	}
	for round := range 3 {
		if _, err := b.WatchRoom(k); err != nil {
			t.Fatal(err)
		}
		ref, err := a.internKey(k)
		if err != nil {
			t.Fatal(err)
		}
		s, lane := a.seg, b.lane
		simulateDeath(b)
		c, err := Open(a.Spec(), testOpts)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if c.lane != lane {
			t.Fatalf("round %d: new process took lane %d, not the dead one's %d", round, c.lane, lane)
		}
		if atomic.LoadUint64(s.u64(s.watchOff(ref.idx, lane)))&laneBit(lane) != 0 {
			t.Fatalf("round %d: the new process in lane %d inherits the dead watcher's bit", round, lane)
		}
		before := atomic.LoadUint64(s.u64(s.keyOff(ref.idx) + kfRoomSeq))
		useLocalOnce(t, a, k).Complete()
		if atomic.LoadUint64(s.u64(s.keyOff(ref.idx)+kfRoomSeq)) != before {
			t.Fatalf("round %d: a unit given back counted for a dead process's watch", round)
		}
		exec := useLocalOnce(t, a, k)
		w, err := c.WatchRoom(k)
		if err != nil {
			t.Fatal(err)
		}
		exec.Complete()
		if !readyWithin(w.Ready(), 3*time.Second) {
			t.Fatalf("round %d: the new process's watch not woken by a sibling's unit", round)
		}
		w.Close()
		if atomic.LoadUint64(s.u64(s.watchOff(ref.idx, lane)))&laneBit(lane) != 0 {
			t.Fatalf("round %d: watch bit outlived the new process's only watch", round)
		}
		b = c
	}
}
