package proxy

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// TestAdvRefusedDroppedRequestFailsFast: an upstream that closes every
// connection on which it reads a request for /drop (a blocked client, a
// "return 444" rule, a request that crashes its worker, a TCP balancer with
// no healthy backend), a fleet cap of 2; also with a connection to the same
// address that another process of the user closed early (an orphan that is
// none of this key's). The stock transport sends each GET once, on a new
// connection, and fails it at once; so must this one, and a GET to a
// healthy path of the same upstream must not wait behind them. Taken for
// refusals, each GET was sent 1+MaxRetries times, each of its connections
// keeping a unit of the cap: ten concurrent GETs made 40 connections, took
// seconds, and the healthy GET failed for want of a connection.
func TestAdvRefusedDroppedRequestFailsFast(t *testing.T) {
	for _, foreign := range []bool{false, true} {
		t.Run(fmt.Sprintf("foreignOrphan=%v", foreign), func(t *testing.T) {
			droppedRequestsFailFast(t, foreign)
		})
	}
}

func droppedRequestsFailFast(t *testing.T, foreign bool) {
	up := startAdv2Upstream(t, 20*time.Second)
	spec := testSpec
	spec.Path = filepath.Join(t.TempDir(), "seg")
	m := newMemberOpts(t, spec, NodeOptions{SweepInterval: 50 * time.Millisecond},
		func(tr *Transport) { tr.MaxConnsPerKey = 2 })
	if foreign {
		adv2ForeignOrphan(t, up)
	}

	start := time.Now()
	err := getBody(context.Background(), m.tr, up.url+"/drop1")
	t.Logf("one GET /drop1: %v after %v, sent %d times on %d connections", err, time.Since(start).Round(time.Millisecond), up.count("/drop1"), up.conns.Load())
	if err == nil {
		t.Fatal("dropped GET answered")
	}
	if n := up.count("/drop1"); n != 1 {
		t.Errorf("a GET the upstream drops on a new connection was sent %d times, want 1 (as net/http)", n)
	}

	const n = 10
	var wg sync.WaitGroup
	var mu sync.Mutex
	var slowest time.Duration
	conns0 := up.conns.Load()
	start = time.Now()
	for range n {
		wg.Go(func() {
			s := time.Now()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			getBody(ctx, m.tr, up.url+"/drop")
			mu.Lock()
			slowest = max(slowest, time.Since(s))
			mu.Unlock()
		})
	}
	// A healthy request to the same upstream, meanwhile, with a second.
	time.Sleep(10 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	s := time.Now()
	req, _ := http.NewRequestWithContext(ctx, "GET", up.url+"/ok", nil)
	// Its connection must not go idle: a GET /drop that reused it would
	// be sent again, rightly, as net/http sends one whose reused
	// connection closes before answering.
	req.Close = true
	resp, okErr := m.tr.RoundTrip(req)
	if okErr == nil {
		resp.Body.Close()
	}
	okTook := time.Since(s)
	cancel()
	wg.Wait()
	t.Logf("%d concurrent GET /drop: slowest failed after %v; upstream saw %d requests on %d connections; UpstreamRefused=%d; healthy GET: %v after %v",
		n, slowest.Round(time.Millisecond), up.count("/drop"), up.conns.Load()-conns0, m.node.Stats().UpstreamRefused, okErr, okTook.Round(time.Millisecond))
	if got := up.count("/drop"); got > n {
		t.Errorf("%d GETs dropped by the upstream were sent %d times", n, got)
	}
	if slowest > time.Second {
		t.Errorf("GETs the upstream drops at once took up to %v to fail", slowest)
	}
	if okErr != nil {
		t.Errorf("a healthy GET to the same upstream failed behind them: %v", okErr)
	}
}
