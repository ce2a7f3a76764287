package proxy

import (
	"context"
	"net/http"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// TestAdvRefusedDroppedRequestFailsFast: an upstream that closes every
// connection on which it reads a request for /drop (a blocked client, a
// "return 444" rule, a request that crashes its worker, a TCP balancer with
// no healthy backend), a fleet cap of 2. The stock transport, and this one
// before the refusal hold, sends each GET once, on a new connection, and
// fails it at once. Now each GET is sent 1+MaxRetries times, and each of its
// connections keeps a unit of the cap for closeWait after its close: ten
// concurrent GETs that the upstream answers in no time make 40 connections,
// take seconds, and GETs to the healthy paths of the same upstream wait
// behind them for the cap.
func TestAdvRefusedDroppedRequestFailsFast(t *testing.T) {
	up := startAdvRefusedUpstream(t)
	spec := testSpec
	spec.Path = filepath.Join(t.TempDir(), "seg")
	m := newMemberOpts(t, spec, NodeOptions{SweepInterval: 50 * time.Millisecond},
		func(tr *Transport) { tr.MaxConnsPerKey = 2 })

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
