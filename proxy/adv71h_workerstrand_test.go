package proxy

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"
)

// TestAdv71hH2EvictPassedOverLocalHolderNoStream: the local twin of
// TestAdv71hH2EvictPassedOverLeaseWithdrawn, in one process. R, a request
// to key K, is given X (an h2c connection with no stream) by the pool and
// waits for a worker of the Governor (Transport.once: b.workers after
// Acquire). E's eviction reads X's one user (R) and passes it over, leaving
// it offered (not draining: a holder may end with no stream). R's deadline
// ends its wait: it completes its Execution with no stream (retry-safe
// "budget"). E, paused for room (only wakes serve it), must be woken to
// evict X. Asserted: X passed over without a drain, and E not woken over
// and over meanwhile (at most 10 asks of the pool while R holds X); then X
// leaves the table and E is served within E's 5s deadline.
func TestAdv71hH2EvictPassedOverLocalHolderNoStream(t *testing.T) {
	f := newAdv71IdleH2(t, func(n *Node) *Transport {
		return &Transport{Node: n, H2C: true, HTTP2: true, fullPauseBase: time.Minute}
	})
	m, s, x, hk, closeO, releaseWorker := f.m, f.s, f.x, f.hk, f.releaseY, f.releaseWorker
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
	cp := &adv70bCountPolicy{}
	he := &Transport{Node: m.node, MaxConnsPerKey: 4, fullPauseBase: time.Minute, Policy: cp}
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
	asks := cp.n.Load() // while R held X
	releaseWorker()
	if asks > 10 {
		closeO()
		<-eCh
		t.Fatalf("E asked the pool %d times while R held X: passing X over woke E to pass it over again", asks)
	}
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
