package proxy

import (
	"net/http"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/orbitpool"
)

// TestAdv70WakeNotSpentWhileEvictionLeaves: request W1 paused for room
// evicts an idle connection X to make it (a capped key's: X leaves in good
// order, keeping its slot up to closeWait) and pauses again. W2 pauses
// behind it. Then connection Y goes idle: the wake goes to W1, which may
// not evict while X still leaves, and pauses again, last; the wake is
// spent. X's slot then goes to W2 (its stream holds it). Y sits idle and
// evictable, the room W1 needs, but no wake comes: W1 must still be served
// (every pause is longer than the deadline, as in TestFullPauseWokenByRoom,
// so only a wake serves it; in production, only its next pause).
func TestAdv70WakeNotSpentWhileEvictionLeaves(t *testing.T) {
	spec := orbitpool.PoolSpec{Lanes: 1, Keys: 8, ResourcesPerLane: 2}
	rel1, rel2, rel3 := make(chan struct{}), make(chan struct{}), make(chan struct{})
	o1 := closingStreamUpstream(t, rel1, false)
	o2 := closingStreamUpstream(t, rel2, false)
	k1 := closingStreamUpstream(t, nil, false)
	k2 := closingStreamUpstream(t, rel3, false)
	m := newMember(t, spec, func(tr *Transport) {
		tr.MaxConnsPerKey = 8
		tr.fullPauseBase = time.Minute
	})
	r1 := holdStreams(t, m, o1, 1)[0]
	r2 := holdStreams(t, m, o2, 1)[0]
	w1 := make(chan error, 1)
	go func() {
		_, _, err := roundTripWithin(m.tr, k1+"/", 6*time.Second)
		w1 <- err
	}()
	waitFor(t, 3*time.Second, "W1 to pause", func() bool { return m.node.room.n.Load() == 1 })
	close(rel1)
	drain(r1)
	waitFor(t, 3*time.Second, "W1 to evict X and pause again", func() bool {
		return m.node.Stats().Evicted == 1 && m.node.room.n.Load() == 1
	})
	w2 := make(chan *http.Response, 1)
	go func() {
		req, _ := http.NewRequest("GET", k2+"/stream", nil)
		resp, err := m.tr.RoundTrip(req)
		if err != nil {
			resp = nil
		}
		w2 <- resp
	}()
	waitFor(t, 3*time.Second, "W2 to pause", func() bool { return m.node.room.n.Load() == 2 })
	early := m.node.Stats().Retired == 0 // X still leaving: the case under test
	close(rel2)
	drain(r2)
	var resp2 *http.Response
	select {
	case resp2 = <-w2:
	case <-time.After(3 * time.Second):
	}
	if resp2 != nil {
		defer drain(resp2) // runs after rel3 is closed below
	}
	defer close(rel3)
	select {
	case err := <-w1:
		if err != nil {
			t.Fatalf("W1 (Y idle and evictable since, X leaving when Y went idle: %v): %v; want it served", early, err)
		}
	case <-time.After(3 * time.Second):
		t.Fatalf("W1 not served 3s after Y went idle and evictable (X leaving then: %v; W2 served: %v; %d idle in the table, %d waiters); the wake was spent by W1 while its own eviction left, none came after", early, resp2 != nil, adv70Idle(m), m.node.room.n.Load())
	}
	if resp2 == nil {
		t.Fatal("W2 not served")
	}
}
