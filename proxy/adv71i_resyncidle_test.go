package proxy

import (
	"context"
	"errors"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/governor"
	"github.com/orbitproxy/orbit/orbitpool"
)

// TestAdv71iH2PassOverResyncIdleExpiredHolderServed: X, K's h2c
// connection, is idle past its IdleConnTimeout (the sweep is a minute
// away) when R, a request to K, is given its unit and waits for a worker.
// E's eviction pauses X, finds R holding it and passes it over; the
// resync then finds X expired and drains and retires it under R, with R's
// unit still out. Asserted: X leaves the table, E is served, and R, once
// it has its worker, is served (on another connection) or fails
// retry-safe; and no connection is left paused without a read in flight.
func TestAdv71iH2PassOverResyncIdleExpiredHolderServed(t *testing.T) {
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
	hk := &Transport{Node: m.node, H2C: true, HTTP2: true, IdleConnTimeout: 300 * time.Millisecond, fullPauseBase: 2 * time.Millisecond}
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
	waitFor(t, 2*time.Second, "X idle past its timeout", x.idleExpired)
	ls, ok := gov.TryAcquire()
	if !ok {
		t.Fatalf("want a free worker for the test to hold")
	}
	var relOnce sync.Once
	releaseWorker := func() { relOnce.Do(ls.Release) }
	defer releaseWorker()
	type result struct {
		body string
		err  error
	}
	rCh := make(chan result, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", s.url+"/", nil)
		resp, err := hk.RoundTrip(req)
		var b []byte
		if err == nil {
			b, err = io.ReadAll(resp.Body)
			resp.Body.Close()
		}
		rCh <- result{string(b), err}
	}()
	waitFor(t, 2*time.Second, "R to hold X's unit", func() bool {
		u, err := m.pool.Users(x.id)
		return err == nil && u == 1
	})
	he := &Transport{Node: m.node, MaxConnsPerKey: 4, fullPauseBase: 2 * time.Millisecond}
	jURL := closingStreamUpstream(t, nil, false)
	eCh := make(chan error, 1)
	go func() {
		_, body, err := roundTripWithin(he, jURL+"/", 4*time.Second)
		if err == nil && body != "ok" {
			err = errors.New("body " + body)
		}
		eCh <- err
	}()
	start := time.Now()
	for m.node.lookupH2(x.id) == x && time.Since(start) < 3*time.Second {
		time.Sleep(5 * time.Millisecond)
	}
	left := m.node.lookupH2(x.id) != x
	releaseWorker() // E and R need a worker each, one after the other
	eErr := <-eCh
	r := <-rCh
	if !left || eErr != nil {
		closeO()
		t.Fatalf("X expired, passed over for R: left the table %v (draining %v); E: %v; stats %+v", left, x.isDraining(), eErr, m.node.Stats())
	}
	if r.err != nil {
		if pe, ok := r.err.(*Error); !ok || !pe.RetrySafe {
			closeO()
			t.Fatalf("R, whose unit was on X when X was drained: not retry-safe: %v", r.err)
		}
	} else if r.body != "ok" {
		closeO()
		t.Fatalf("R: body %q", r.body)
	}
	for i := range m.node.h2slots {
		if c := m.node.h2slots[i].Load(); c != nil && !c.isDraining() && !c.offered() && !c.syncing.Load() {
			closeO()
			t.Fatalf("connection %v left paused", c.id)
		}
	}
	t.Logf("R: %q %v; stats %+v", r.body, r.err, m.node.Stats())
}
