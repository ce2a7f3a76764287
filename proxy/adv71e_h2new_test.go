package proxy

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/orbitpool"
)

// TestAdv71eNewH2ConnWakesKeyWaiters: a table of two slots holds two held
// HTTP/1.1 exchanges, B on a connection that closes when its exchange
// ends. Three requests to an h2c upstream (100 streams a connection), each a
// long-lived stream, pause for room (every pause outlasts the deadlines:
// only wakes serve them). B ends and its connection leaves the table: a
// free slot (roomFree) wakes the oldest, which dials an h2c connection
// there and keeps a stream of it. That connection has room for 99 more
// streams of the key, which the other two paused requests can use: they
// must be served, not left asleep (no event says a connection of their key
// with room for streams came).
func TestAdv71eNewH2ConnWakesKeyWaiters(t *testing.T) {
	spec := orbitpool.PoolSpec{Lanes: 1, Keys: 16, ResourcesPerLane: 2}
	relA, relB, h2release := make(chan struct{}), make(chan struct{}), make(chan struct{})
	var oa, ob, oh sync.Once
	endA := func() { oa.Do(func() { close(relA) }) }
	endB := func() { ob.Do(func() { close(relB) }) }
	endH2 := func() { oh.Do(func() { close(h2release) }) }
	defer endA()
	defer endB()
	defer endH2()
	s := h2cHoldServer(t, h2release, 100)
	t.Cleanup(endH2)
	m := newMember(t, spec, func(tr *Transport) {
		tr.H2C = true
		tr.HTTP2 = true
		tr.fullPauseBase = time.Minute
	})
	h1 := &member{pool: m.pool, node: m.node, tr: &Transport{Node: m.node}}
	holdStreams(t, h1, closingStreamUpstream(t, relA, false), 1)
	heldB := holdStreams(t, h1, closingStreamUpstream(t, relB, true), 1)[0]
	const n = 3
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
	defer cancel()
	got := make(chan error, n)
	for range n {
		go func() {
			req, _ := http.NewRequestWithContext(ctx, "GET", s.url+"/hold", nil)
			resp, err := m.tr.RoundTrip(req)
			if err == nil {
				t.Cleanup(func() { resp.Body.Close() })
			}
			got <- err
		}()
	}
	waitFor(t, 3*time.Second, "the requests to pause for room", func() bool { return m.node.room.n.Load() == n })
	endB()
	drain(heldB)
	served, last := 0, error(nil)
	for range n {
		if err := <-got; err == nil {
			served++
		} else {
			last = err
		}
	}
	left := m.node.room.n.Load()
	endH2()
	endA()
	if served != n {
		t.Fatalf("%d of %d paused requests served once a connection of their key with room for 99 more streams was in the table (%d still queued; stats %+v); one failed: %v", served, n, left, m.node.Stats(), last)
	}
}
