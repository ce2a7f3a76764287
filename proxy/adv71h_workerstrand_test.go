package proxy

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/governor"
	"github.com/orbitproxy/orbit/orbitpool"
)

// TestAdv71hH2EvictPassedOverLocalHolderNoStream: the local twin of
// TestAdv71hH2EvictPassedOverLeaseWithdrawn, in one process. R, a request
// to key K, is given X (an h2c connection with no stream) by the pool and
// waits for a worker of the Governor (Transport.once: b.workers after
// Acquire). E's eviction reads X's one user (R) and passes it over, leaving
// it offered (not draining: a holder may end with no stream). R's deadline
// ends its wait: it completes its Execution with no stream (retry-safe
// "budget"). E, paused for room (only wakes serve it), must be woken to
// evict X. Asserted: X passed over without a drain, then X leaves the
// table and E is served within E's 5s deadline.
func TestAdv71hH2EvictPassedOverLocalHolderNoStream(t *testing.T) {
	spec := orbitpool.PoolSpec{Lanes: 1, Keys: 16, ResourcesPerLane: 2}
	relO, h2release := make(chan struct{}), make(chan struct{})
	var o1, o2 sync.Once
	closeO := func() { o1.Do(func() { close(relO) }) }
	endH2 := func() { o2.Do(func() { close(h2release) }) }
	defer closeO()
	defer endH2()
	s := h2cHoldServer(t, h2release, 8)
	gov := governor.New(2, 0)
	m := newMemberOpts(t, spec, NodeOptions{SweepInterval: time.Minute, Governor: gov}, nil)
	hk := &Transport{Node: m.node, H2C: true, HTTP2: true, fullPauseBase: time.Minute}
	if _, body, err := roundTripWithin(hk, s.url+"/", 2*time.Second); err != nil || body != "ok" {
		t.Fatalf("X's first stream: %q %v", body, err)
	}
	holdStreams(t, m, closingStreamUpstream(t, relO, false), 1) // Y: holds a worker
	var x *h2conn
	for i := range m.node.h2slots {
		if c := m.node.h2slots[i].Load(); c != nil {
			x = c
		}
	}
	if st := m.node.Stats(); st.OpenConns != 2 || x == nil || x.active.Load() != 0 || !x.ended.Load() {
		t.Fatalf("want a full table with X, an h2c connection with no stream: %+v", st)
	}
	ls, ok := gov.TryAcquire() // the other worker: R waits for it
	if !ok {
		t.Fatalf("want a free worker for the test to hold")
	}
	var relOnce sync.Once
	releaseWorker := func() { relOnce.Do(ls.Release) }
	defer releaseWorker()
	rErr := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", s.url+"/", nil)
		resp, err := hk.RoundTrip(req)
		if err == nil {
			drain(resp)
		}
		rErr <- err
	}()
	waitFor(t, 2*time.Second, "R to hold X's unit", func() bool {
		u, err := m.pool.Users(x.id)
		return err == nil && u == 1
	})
	he := &Transport{Node: m.node, MaxConnsPerKey: 4, fullPauseBase: time.Minute}
	jURL := closingStreamUpstream(t, nil, false)
	eCh := make(chan error, 1)
	go func() {
		_, body, err := roundTripWithin(he, jURL+"/", 5*time.Second)
		if err == nil && body != "ok" {
			err = errors.New("body " + body)
		}
		eCh <- err
	}()
	waitFor(t, 3*time.Second, "E to pause", func() bool { return m.node.room.n.Load() == 1 })
	passedOver := !x.isDraining() && m.node.lookupH2(x.id) == x
	r := <-rErr
	releaseWorker()
	if !passedOver || r == nil {
		closeO()
		<-eCh
		t.Fatalf("want X passed over by E's eviction, not drained (draining %v), and R failed waiting for a worker (R: %v)", x.isDraining(), r)
	}
	start := time.Now()
	for m.node.lookupH2(x.id) == x && time.Since(start) < 3*time.Second {
		time.Sleep(5 * time.Millisecond)
	}
	left := m.node.lookupH2(x.id) != x
	err := <-eCh
	if !left || err != nil {
		closeO()
		u, uerr := m.pool.Users(x.id)
		t.Fatalf("X passed over for R, R done with no stream (%v): X left the table %v (draining %v, streams %d, users %d %v); E: %v (stats %+v); want X gone and E served",
			r, left, x.isDraining(), x.active.Load(), u, uerr, err, m.node.Stats())
	}
}
