package proxy

import (
	"context"
	"errors"
	"io"
	"net/http"
	"testing"
	"time"
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
	f := newAdv71IdleH2(t, func(n *Node) *Transport {
		return &Transport{Node: n, H2C: true, HTTP2: true, IdleConnTimeout: 300 * time.Millisecond, fullPauseBase: 2 * time.Millisecond}
	})
	m, s, x, hk, closeO, releaseWorker := f.m, f.s, f.x, f.hk, f.releaseY, f.releaseWorker
	waitFor(t, 2*time.Second, "X idle past its timeout", x.idleExpired)
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
