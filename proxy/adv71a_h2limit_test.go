package proxy

import (
	"errors"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/orbitpool"
)

// TestAdv71aH2LimitRaisedWakesPaused: a table of two slots holds a held
// HTTP/1.1 stream and an h2c connection whose upstream allows one stream at
// a time, that one held. A request to the h2c upstream finds no stream and
// no room for a connection: it pauses for room (every pause outlasts its
// deadline: only a wake serves it). The upstream then raises its
// SETTINGS_MAX_CONCURRENT_STREAMS to 100: the connection has room for the
// key's streams, as when a stream ends (which wakes the key's oldest). The
// paused request must be woken and served on that connection, while the held
// stream still runs.
func TestAdv71aH2LimitRaisedWakesPaused(t *testing.T) {
	spec := orbitpool.PoolSpec{Lanes: 1, Keys: 16, ResourcesPerLane: 2}
	release, h2release := make(chan struct{}), make(chan struct{})
	var o1, o2 sync.Once
	endH1 := func() { o1.Do(func() { close(release) }) }
	endH2 := func() { o2.Do(func() { close(h2release) }) }
	defer endH1()
	defer endH2()
	up := newRawH2(t, func(s *rawStream) {
		if s.path == "/hold" {
			s.headers(false, ":status", "200")
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
	t.Cleanup(func() { endH2() }) // before up.close (cleanups run last first)
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
	done := make(chan error, 1)
	go func() {
		_, body, err := roundTripWithin(m.tr, up.url+"/", 4*time.Second)
		if err == nil && body != "ok" {
			err = errors.New("body " + body)
		}
		done <- err
	}()
	waitFor(t, 3*time.Second, "the request to pause for room", func() bool { return m.node.room.n.Load() == 1 })
	start := time.Now()
	up.setLimit(100)
	waitFor(t, 5*time.Second, "the h2c connection at capacity 100", func() bool {
		c, _ := m.pool.Candidates(key, nil)
		return len(c) == 1 && c[0].Capacity == 100
	})
	err = <-done
	waited := time.Since(start)
	endH2()
	endH1()
	if err != nil {
		t.Fatalf("the paused request once its key's connection had room for 99 more streams: %v after %v (stats %+v); want it woken and served", err, waited, m.node.Stats())
	}
	if w := m.node.room.n.Load(); w != 0 {
		t.Fatalf("%d waiters left queued", w)
	}
}
