package proxy

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/orbitpool"
)

// TestAdv71eH2LimitRaisedWakesEveryPaused: TestAdv71aH2LimitRaisedWakesPaused
// with three paused requests to the h2c upstream, each a long-lived stream
// (held open once it has its head). The upstream raises its
// SETTINGS_MAX_CONCURRENT_STREAMS from 1 to 100: room for 99 more streams
// on the connection. syncH2Now signals one roomStream event, which wakes
// the key's oldest; it takes a stream and keeps it, so nothing passes the
// wake on and no stream ends. The other two must be served as well (their
// pauses outlast their deadlines: only wakes serve them), not left asleep
// beside 98 free streams.
func TestAdv71eH2LimitRaisedWakesEveryPaused(t *testing.T) {
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
	t.Cleanup(func() { endH2() })
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
	const n = 3
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
	defer cancel()
	got := make(chan error, n)
	for range n {
		go func() {
			req, _ := http.NewRequestWithContext(ctx, "GET", up.url+"/hold", nil)
			resp, err := m.tr.RoundTrip(req)
			if err == nil {
				t.Cleanup(func() { resp.Body.Close() })
			}
			got <- err
		}()
	}
	waitFor(t, 3*time.Second, "the requests to pause for room", func() bool { return m.node.room.n.Load() == n })
	up.setLimit(100)
	waitFor(t, 5*time.Second, "the h2c connection at capacity 100", func() bool {
		c, _ := m.pool.Candidates(key, nil)
		return len(c) == 1 && c[0].Capacity == 100
	})
	served, var1 := 0, error(nil)
	for range n {
		if err := <-got; err == nil {
			served++
		} else {
			var1 = err
		}
	}
	left := m.node.room.n.Load()
	endH2()
	endH1()
	if served != n {
		t.Fatalf("%d of %d paused requests served once their key's connection had room for 99 more streams (%d still queued); one failed: %v", served, n, left, var1)
	}
}
