package proxy

import (
	"errors"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/orbitpool"
)

// TestAdv71aH2GoAwayWhilePaused: a table of two slots holds a held HTTP/1.1
// stream and an h2c connection allowing one stream, that one held. Two
// requests to the h2c upstream pause for room (every pause outlasts their
// deadlines: only wakes serve them). The upstream then sends GOAWAY (the
// held stream may finish) and ends the held stream: the connection drains
// and leaves the table. Both paused requests must be woken and served, on a
// new connection, and nothing may stay queued.
func TestAdv71aH2GoAwayWhilePaused(t *testing.T) {
	spec := orbitpool.PoolSpec{Lanes: 1, Keys: 16, ResourcesPerLane: 2}
	release, goaway, h2release := make(chan struct{}), make(chan struct{}), make(chan struct{})
	var o1, o2, o3 sync.Once
	endH1 := func() { o1.Do(func() { close(release) }) }
	sendGoAway := func() { o2.Do(func() { close(goaway) }) }
	endH2 := func() { o3.Do(func() { close(h2release) }) }
	defer endH1()
	up := newRawH2(t, func(s *rawStream) {
		if s.path == "/hold" {
			s.headers(false, ":status", "200")
			select {
			case <-goaway:
				s.goAway(s.id)
			case <-time.After(20 * time.Second):
			}
			select {
			case <-h2release:
			case <-time.After(20 * time.Second):
			}
			s.data(true, nil)
			return
		}
		s.headers(false, ":status", "200", "content-length", "2")
		s.data(true, []byte("ok"))
	})
	t.Cleanup(func() { sendGoAway(); endH2() }) // before up.close
	m := newMember(t, spec, func(tr *Transport) {
		tr.H2C = true
		tr.HTTP2 = true
		tr.fullPauseBase = time.Minute
	})
	h1 := &Transport{Node: m.node}
	holdStreams(t, &member{pool: m.pool, node: m.node, tr: h1}, closingStreamUpstream(t, release, false), 1)
	req, _ := http.NewRequest("GET", up.url+"/hold", nil)
	held, err := m.tr.RoundTrip(req)
	if err != nil {
		t.Fatalf("the held h2c stream: %v", err)
	}
	defer held.Body.Close()
	key := mustKey(t, m.tr, up.url)
	up.setLimit(1)
	waitFor(t, 5*time.Second, "the h2c connection at capacity 1", func() bool {
		c, _ := m.pool.Candidates(key, nil)
		return len(c) == 1 && c[0].Capacity == 1
	})
	const k = 2
	done := make(chan error, k)
	for i := range k {
		go func() {
			_, body, err := roundTripWithin(m.tr, up.url+"/", 6*time.Second)
			if err == nil && body != "ok" {
				err = errors.New("body " + body)
			}
			done <- err
		}()
		waitFor(t, 3*time.Second, "the request to pause for room", func() bool { return m.node.room.n.Load() == int32(i+1) })
	}
	sendGoAway()
	time.Sleep(50 * time.Millisecond) // the GOAWAY read before the stream ends
	endH2()
	drain(held)
	var errs []error
	for range k {
		if err := <-done; err != nil {
			errs = append(errs, err)
		}
	}
	endH1()
	if len(errs) > 0 {
		t.Fatalf("paused requests after their key's connection went away and left: %v (stats %+v); want each woken and served on a new connection", errs, m.node.Stats())
	}
	if w, keys := m.node.room.n.Load(), len(m.node.room.byKey); w != 0 || keys != 0 {
		t.Fatalf("%d waiters, %d keys left queued", w, keys)
	}
}
