package proxy

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"testing"
	"time"
)

// TestAdv71iH2PassOverResyncAfterHolderEndsLosesIdleWake: the interleaving
// of TestAdv71hH2EvictPassedOverLocalHolderNoStream with the resync of the
// pass-over late. A read of X's state is in flight when E's eviction
// pauses X (capacity 0) and finds R holding it: the resync is left to that
// read (stateH2). R then ends with no stream (its wait for a worker ran
// out) and wakes E for an idle connection; E looks for one to evict, but X
// is still paused (not offered) and E pauses again. The read in flight
// ends and its resync gives X its capacity back (syncH2Now:
// signalKey(K, more, false)), as room for K's streams only: X is idle with
// no holder, and nobody wakes E to evict it. Asserted: X leaves the table
// and E is served within E's 5s deadline.
func TestAdv71iH2PassOverResyncAfterHolderEndsLosesIdleWake(t *testing.T) {
	f := newAdv71IdleH2(t, func(n *Node) *Transport {
		return &Transport{Node: n, H2C: true, HTTP2: true, fullPauseBase: time.Minute}
	})
	m, s, x, hk, closeO, releaseWorker := f.m, f.s, f.x, f.hk, f.releaseY, f.releaseWorker
	block := make(chan struct{})
	var o3 sync.Once
	unblock := func() { o3.Do(func() { close(block) }) }
	defer unblock()
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
	// A read of X's state in flight (the follower's, say, behind X's
	// write lock): held until the test lets it end.
	m.node.syncH2Off(x, func(*h2conn) { <-block })
	waitFor(t, 2*time.Second, "the read in flight", func() bool { return x.syncing.Load() })

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
	passedOver := !x.isDraining() && m.node.lookupH2(x.id) == x && !x.offered()
	r := <-rErr // R's wait for a worker ends: it completes X's unit with no stream
	releaseWorker()
	if !passedOver || r == nil {
		unblock()
		closeO()
		<-eCh
		t.Fatalf("want X paused by E's eviction, passed over, not drained (draining %v), and R failed waiting for a worker (R: %v)", x.isDraining(), r)
	}
	// E, woken by R's end, finds X still paused and pauses again.
	time.Sleep(300 * time.Millisecond)
	unblock() // the read ends; its resync gives X its capacity back
	waitFor(t, 2*time.Second, "X offered again", func() bool { return x.offered() || x.isDraining() })
	start := time.Now()
	for m.node.lookupH2(x.id) == x && time.Since(start) < 3*time.Second {
		time.Sleep(5 * time.Millisecond)
	}
	left := m.node.lookupH2(x.id) != x
	err := <-eCh
	if !left || err != nil {
		closeO()
		u, uerr := m.pool.Users(x.id)
		t.Fatalf("X passed over for R, R done with no stream (%v) before the resync: X left the table %v (offered %v, draining %v, streams %d, users %d %v); E: %v (stats %+v); want X gone and E served",
			r, left, x.offered(), x.isDraining(), x.active.Load(), u, uerr, err, m.node.Stats())
	}
}
