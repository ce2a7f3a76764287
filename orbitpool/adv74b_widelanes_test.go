package orbitpool

import (
	"sync/atomic"
	"testing"
	"time"
)

// TestAdv74bWatchWideLanes: with 72 lanes (two mask words), a watcher in
// the second word is woken by an owner in another word, and not by
// units of its own; a closed pool (with its watch armed and never closed)
// leaves no watch bit, and units given back after count nothing.
func TestAdv74bWatchWideLanes(t *testing.T) {
	spec := PoolSpec{Lanes: 72, Keys: 8, ResourcesPerLane: 2}
	ps := openShared(t, spec, 72)
	byLane := map[int]*Pool{}
	for _, p := range ps {
		byLane[p.lane] = p
	}
	for _, pair := range [][2]int{{0, 65}, {65, 0}, {71, 64}, {63, 71}} {
		owner, watcher := byLane[pair[0]], byLane[pair[1]]
		if owner == nil || watcher == nil {
			t.Fatalf("lanes %v not all open", pair)
		}
		k := Key{0x74b0, uint64(pair[0]<<8 | pair[1])}
		id, err := owner.Register(k, 1)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := watcher.Register(k, 1); err != nil {
			t.Fatal(err)
		}
		exec := useLocalOnce(t, owner, k)
		w, err := watcher.WatchRoom(k)
		if err != nil {
			t.Fatal(err)
		}
		useLocalOnce(t, watcher, k).Complete()
		if readyWithin(w.Ready(), 50*time.Millisecond) {
			t.Fatalf("lanes %v: watch woken by its own process's unit", pair)
		}
		exec.Complete()
		if !readyWithin(w.Ready(), 3*time.Second) {
			t.Fatalf("lanes %v: owner's unit came back and the watch in lane %d was not woken", pair, pair[1])
		}
		w.Rearm()
		if err := owner.SetCapacity(id, 2); err != nil {
			t.Fatal(err)
		}
		if !readyWithin(w.Ready(), 3*time.Second) {
			t.Fatalf("lanes %v: owner's capacity raised and the watch was not woken", pair)
		}
		if u := w.Rearm(); u != 1 {
			t.Fatalf("lanes %v: Rearm reported %d units, want 1", pair, u)
		}
		ref, _ := owner.lookupKey(k)
		s := owner.seg
		lane := watcher.lane
		if atomic.LoadUint64(s.u64(s.watchOff(ref.idx, lane)))&laneBit(lane) == 0 {
			t.Fatalf("lanes %v: armed watch has no bit", pair)
		}
		watcher.Close() // the watch left open
		if !ready(w.Ready()) {
			t.Fatalf("lanes %v: a closed pool's watch is not woken", pair)
		}
		for i := range (spec.Lanes + 63) / 64 {
			if m := atomic.LoadUint64(s.u64(s.watchOff(ref.idx, 64*i))); m != 0 {
				t.Fatalf("lanes %v: watch mask word %d is %#x after the only watcher's pool closed", pair, i, m)
			}
		}
		before := atomic.LoadUint64(s.u64(s.keyOff(ref.idx) + kfRoomSeq))
		useLocalOnce(t, owner, k).Complete()
		if atomic.LoadUint64(s.u64(s.keyOff(ref.idx)+kfRoomSeq)) != before {
			t.Fatalf("lanes %v: a unit given back with no watch counted", pair)
		}
		// The closed watcher's lane, reopened by a new process, starts clean.
		np, err := Open(ps[0].Spec(), testOpts)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { np.Close() })
		byLane[np.lane] = np
		if np.lane != lane {
			continue
		}
		if atomic.LoadUint64(s.u64(s.watchOff(ref.idx, lane)))&laneBit(lane) != 0 {
			t.Fatalf("lanes %v: new process in lane %d inherits a watch bit", pair, lane)
		}
	}
}
