package proxy

import (
	"context"
	"io"
	"net/http"
	"path/filepath"
	"testing"
	"time"
)

// TestAdv2RefusedEnforcingHeartbeatStream: a fleet cap of 1,
// FailedCloseWait 300ms, an upstream that serves an SSE-style feed with a
// small heartbeat every 100ms and notices a gone client only when a write
// fails (the half-close here never fails one): it never closes a connection
// whose client left. A client that leaves the feed fails its exchange.
//
// Before any refusal, the failed connection waits failedWait for the
// upstream's close, then closes (and lingeredInVain stops such waits for a
// minute): the next GET, with 3s to live, is served.
//
// Once the upstream is known to enforce its cap (keyCap.enforcing), the
// failed connection's unit stays held while the upstream holds it, past
// failedWait: closed, the connection fails the upstream's next heartbeat,
// and the upstream lets it go. It must not wait a minute for a close that
// never comes: the next GET is served as before.
func TestAdv2RefusedEnforcingHeartbeatStream(t *testing.T) {
	up := startAdv2Upstream(t, 500*time.Millisecond)
	spec := testSpec
	spec.Path = filepath.Join(t.TempDir(), "seg")
	m := newMemberOpts(t, spec, NodeOptions{SweepInterval: 50 * time.Millisecond, FailedCloseWait: 300 * time.Millisecond},
		func(tr *Transport) { tr.MaxConnsPerKey = 1 })

	leaveFeed := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", up.url+"/trickle", nil)
		resp, err := m.tr.RoundTrip(req)
		if err != nil {
			t.Fatalf("feed: %v", err)
		}
		buf := make([]byte, 40)
		if _, err := io.ReadFull(resp.Body, buf); err != nil {
			t.Fatalf("feed body: %v", err)
		}
		resp.Body.Close()
	}
	get := func(what string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		start := time.Now()
		// Connection: close, so that the next request dials.
		req, _ := http.NewRequestWithContext(ctx, "GET", up.url+"/ok", nil)
		req.Close = true
		resp, err := m.tr.RoundTrip(req)
		if err == nil {
			_, err = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		t.Logf("%s: GET /ok: %v after %v", what, err, time.Since(start).Round(time.Millisecond))
		return err
	}

	leaveFeed()
	if err := get("not enforcing, after a client left the feed"); err != nil {
		t.Fatalf("control: %v", err)
	}

	m.node.capOf(m.tr.last.Load().key).refusedAt.Store(sinceStart(time.Now()))
	leaveFeed()
	if err := get("enforcing, after a client left the feed"); err != nil {
		t.Errorf("after one refusal, a client leaving a heartbeat feed holds the key's unit: %v", err)
	}
}
