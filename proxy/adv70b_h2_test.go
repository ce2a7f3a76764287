package proxy

import (
	"errors"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/orbitpool"
)

// TestAdv70bH2StreamEndsWakeInTurn: an h2c upstream allows one stream at a
// time; its connection holds one held stream, and the table's other slot a
// held HTTP/1.1 stream, so a request to the h2c upstream finds no stream and
// no room for a connection: it pauses (every pause outlasts the deadline).
// Five do. Once the held stream ends, each stream's end must wake the next:
// all five are served, on the one connection, and none stays queued. A
// sixth, paused with a short deadline while the stream is held, fails at
// its deadline with ErrNoCapacity wrapping the table's ErrFull.
func TestAdv70bH2StreamEndsWakeInTurn(t *testing.T) {
	spec := orbitpool.PoolSpec{Lanes: 1, Keys: 16, ResourcesPerLane: 2}
	release, h2release := make(chan struct{}), make(chan struct{})
	defer close(release)
	var once sync.Once
	endH2 := func() { once.Do(func() { close(h2release) }) }
	defer endH2()
	s := h2cHoldServer(t, h2release, 1)
	m := newMember(t, spec, func(tr *Transport) {
		tr.H2C = true
		tr.HTTP2 = true
		tr.fullPauseBase = time.Minute
	})
	h1 := &Transport{Node: m.node}
	holdStreams(t, &member{pool: m.pool, node: m.node, tr: h1}, closingStreamUpstream(t, release, false), 1)
	req, _ := http.NewRequest("GET", s.url+"/hold", nil)
	held, err := m.tr.RoundTrip(req)
	if err != nil {
		t.Fatalf("the held h2c stream: %v", err)
	}
	defer held.Body.Close()
	const n = 5
	errs := make(chan error, n)
	for i := range n {
		go func() {
			_, body, err := roundTripWithin(m.tr, s.url+"/", 8*time.Second)
			if err == nil && body != "ok" {
				err = errors.New("body " + body)
			}
			errs <- err
		}()
		waitFor(t, 3*time.Second, "the request to pause", func() bool { return m.node.room.n.Load() == int32(i+1) })
	}
	start := time.Now()
	_, _, err = roundTripWithin(m.tr, s.url+"/", 400*time.Millisecond)
	if !errors.Is(err, ErrNoCapacity) || !errors.Is(err, orbitpool.ErrFull) {
		t.Errorf("a paused h2c request at its deadline: %v; want ErrNoCapacity wrapping orbitpool.ErrFull", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("a paused h2c request ended %v after its start; want at its deadline", d)
	}
	endH2()
	drain(held)
	for range n {
		if err := <-errs; err != nil {
			t.Errorf("a paused h2c request after the held stream ended: %v; want it served", err)
		}
	}
	if w := m.node.room.n.Load(); w != 0 {
		t.Errorf("%d waiters left queued", w)
	}
	if c := s.conns.Load(); c != 1 {
		t.Errorf("%d h2c connections; want the one", c)
	}
}
