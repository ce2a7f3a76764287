package proxy

import (
	"errors"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/orbitpool"
)

// TestAdv70bCloseEndsLongPauses: Node.Close while requests pause for room,
// with pauses longer than their deadlines (fullPauseBase): they end with
// ErrClosed promptly, as a request waiting on the pool does, not at their
// deadline, and none stays queued. A woken request that finds the node
// stopped passes the wake on.
func TestAdv70bCloseEndsLongPauses(t *testing.T) {
	spec := orbitpool.PoolSpec{Lanes: 1, Keys: 16, ResourcesPerLane: 2}
	release := make(chan struct{})
	defer close(release)
	m := newMember(t, spec, nil)
	holdStreams(t, m, closingStreamUpstream(t, release, false), 2)
	wt := &Transport{Node: m.node, MaxConnsPerKey: 8, fullPauseBase: time.Minute}
	const n = 4
	errs := make(chan error, n)
	for i := range n {
		url := closingStreamUpstream(t, nil, false)
		go func() {
			_, _, err := roundTripWithin(wt, url+"/", 8*time.Second)
			errs <- err
		}()
		waitFor(t, 3*time.Second, "the request to pause", func() bool { return m.node.room.n.Load() == int32(i+1) })
	}
	start := time.Now()
	go m.node.Close()
	for range n {
		select {
		case err := <-errs:
			if !errors.Is(err, ErrClosed) {
				t.Errorf("a paused request after Close: %v; want ErrClosed", err)
			}
		case <-time.After(3 * time.Second):
			t.Fatalf("a paused request had not ended %v after Close (%d waiters queued)", time.Since(start), m.node.room.n.Load())
		}
	}
	if w := m.node.room.n.Load(); w != 0 {
		t.Fatalf("%d waiters left queued", w)
	}
}
