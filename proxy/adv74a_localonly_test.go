package proxy

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/orbitpool"
)

// TestAdv74aLocalOnlyWakeOwnKey: local_only, one process, a lane of two
// slots: one holds a stream to S, the other X's connection, busy. A
// request to Y (capped, so it cannot go outside the table) pauses for room
// first; then one to X (local_only, MaxDialingPerKey 1) pauses too (pauses
// a minute long: only wakes serve them). X's connection goes idle.
// Properties: the X request is served by it (its own key's connection,
// which could serve it at once: no eviction, no dial), and the Y request is
// served too once X's connection is idle again; both by their deadlines.
func TestAdv74aLocalOnlyWakeOwnKey(t *testing.T) {
	spec := orbitpool.PoolSpec{Lanes: 1, Keys: 16, ResourcesPerLane: 2, Path: filepath.Join(t.TempDir(), "seg")}
	m := newMember(t, spec, nil)
	release := make(chan struct{})
	defer close(release)
	holdStreams(t, m, closingStreamUpstream(t, release, false), 1)
	hold, entered := make(chan struct{}), make(chan struct{}, 1)
	holdOpen := true
	defer func() {
		if holdOpen {
			close(hold)
		}
	}()
	x, xAccepted := adv72bHoldUpstream(t, hold, entered)
	y := discardUpstream(t)
	tx := &Transport{Node: m.node, Policy: orbitpool.LocalOnly{}, MaxDialingPerKey: 1, fullPauseBase: time.Minute}
	ty := &Transport{Node: m.node, MaxConnsPerKey: 1, fullPauseBase: time.Minute}
	heldDone := make(chan error, 1)
	go func() {
		_, _, err := roundTripWithin(tx, x.URL+"/hold", 5*time.Second)
		heldDone <- err
	}()
	<-entered
	yDone, xDone := make(chan error, 1), make(chan error, 1)
	go func() {
		_, _, err := roundTripWithin(ty, y.URL+"/", 3*time.Second)
		yDone <- err
	}()
	waitFor(t, 2*time.Second, "the Y request to pause", func() bool { return m.node.room.n.Load() == 1 })
	go func() {
		_, _, err := roundTripWithin(tx, x.URL+"/", 3*time.Second)
		xDone <- err
	}()
	waitFor(t, 2*time.Second, "the X request to pause", func() bool { return m.node.room.n.Load() == 2 })
	before := m.node.Stats()
	close(hold)
	holdOpen = false
	if err := <-heldDone; err != nil {
		t.Fatalf("held X request: %v", err)
	}
	for name, ch := range map[string]chan error{"X": xDone, "Y": yDone} {
		select {
		case err := <-ch:
			if err != nil {
				t.Errorf("%s request: %v (%+v)", name, err, m.node.Stats())
			}
		case <-time.After(4 * time.Second):
			t.Fatalf("%s request still running", name)
		}
	}
	st := m.node.Stats()
	t.Logf("evicted %d, created %d, X accepted %d", st.Evicted-before.Evicted, st.Created-before.Created, xAccepted.Load())
	if xAccepted.Load() != 1 {
		t.Errorf("X's upstream accepted %d connections: the X request paused for room was not served by X's own connection that went idle (evicted %d)", xAccepted.Load(), st.Evicted-before.Evicted)
	}
	if n := m.node.room.n.Load(); n != 0 {
		t.Errorf("%d requests still queued for room", n)
	}
}
