package orbitpool

import (
	"path/filepath"
	"testing"
	"time"
)

// TestAdv14LaneIncarnation: LaneIncarnation names a lane's live owner, keeps
// naming an owner that left until another process takes the lane (so a
// request still keeps off a gone owner whose lane is free), then names the
// new one; out-of-range lanes and a closed pool give 0.
func TestAdv14LaneIncarnation(t *testing.T) {
	spec := PoolSpec{Path: filepath.Join(t.TempDir(), "seg"), Lanes: 3, Keys: 4, ResourcesPerLane: 4}
	opts := Options{ReconcileInterval: 20 * time.Millisecond}
	watch, err := Open(spec, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Close()
	old, err := Open(spec, opts)
	if err != nil {
		t.Fatal(err)
	}
	lane := old.Lane()
	if got := watch.LaneIncarnation(lane); got != old.Incarnation() {
		t.Fatalf("live owner: %#x, want %#x", got, old.Incarnation())
	}
	for _, l := range []int{-1, 3, 1 << 20} {
		if got := watch.LaneIncarnation(l); got != 0 {
			t.Fatalf("lane %d out of range: %#x, want 0", l, got)
		}
	}
	old.Close()
	watch.Reconcile()
	if got := watch.LaneIncarnation(lane); got != old.Incarnation() {
		t.Fatalf("lane released, not taken again: %#x, want the leaver's %#x", got, old.Incarnation())
	}
	next, err := Open(spec, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer next.Close()
	if next.Lane() != lane {
		t.Fatalf("new process took lane %d, not %d", next.Lane(), lane)
	}
	if got := watch.LaneIncarnation(lane); got != next.Incarnation() || got == old.Incarnation() {
		t.Fatalf("lane taken again: %#x, want the new owner's %#x (old %#x)", got, next.Incarnation(), old.Incarnation())
	}
	if got := old.LaneIncarnation(lane); got != 0 {
		t.Fatalf("on a closed pool: %#x, want 0", got)
	}
}
