package proxy

import (
	"sync"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/governor"
	"github.com/orbitproxy/orbit/orbitpool"
)

// adv71IdleH2 is a full table of two slots, under a Governor of two
// workers: Y, an HTTP/1.1 exchange that holds its connection and a worker
// until releaseY, and X, an h2c connection of s on which one stream has
// ended and none runs. The test holds the other worker until
// releaseWorker. All is released as the test ends.
type adv71IdleH2 struct {
	m             *member
	s             *h2cServer
	hk            *Transport // X's
	x             *h2conn
	releaseY      func()
	releaseWorker func()
}

// newAdv71IdleH2 builds it, with hk, made for the member's node, as X's
// transport.
func newAdv71IdleH2(t *testing.T, hk func(*Node) *Transport) *adv71IdleH2 {
	t.Helper()
	relY, h2release := make(chan struct{}), make(chan struct{})
	var o1, o2, o3 sync.Once
	s := h2cHoldServer(t, h2release, 8)
	t.Cleanup(func() { o2.Do(func() { close(h2release) }) })
	gov := governor.New(2, 0)
	spec := orbitpool.PoolSpec{Lanes: 1, Keys: 16, ResourcesPerLane: 2}
	m := newMemberOpts(t, spec, NodeOptions{SweepInterval: time.Minute, Governor: gov}, nil)
	f := &adv71IdleH2{m: m, s: s, hk: hk(m.node), releaseY: func() { o1.Do(func() { close(relY) }) }}
	if _, body, err := roundTripWithin(f.hk, s.url+"/", 2*time.Second); err != nil || body != "ok" {
		t.Fatalf("X's first stream: %q %v", body, err)
	}
	y := closingStreamUpstream(t, relY, false)
	t.Cleanup(f.releaseY)
	holdStreams(t, m, y, 1)
	for i := range m.node.h2slots {
		if c := m.node.h2slots[i].Load(); c != nil {
			f.x = c
		}
	}
	if st := m.node.Stats(); st.OpenConns != 2 || f.x == nil || f.x.active.Load() != 0 || !f.x.ended.Load() {
		t.Fatalf("want a full table with X, an h2c connection with no stream: %+v", st)
	}
	ls, ok := gov.TryAcquire()
	if !ok {
		t.Fatalf("want a free worker for the test to hold")
	}
	f.releaseWorker = func() { o3.Do(ls.Release) }
	t.Cleanup(f.releaseWorker)
	return f
}
