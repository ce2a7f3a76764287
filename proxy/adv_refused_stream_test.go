package proxy

import (
	"context"
	"io"
	"net/http"
	"path/filepath"
	"testing"
	"time"
)

// advCancelStream opens /stream, reads some of it and gives up, as a client
// that navigates away from an SSE feed.
func advCancelStream(t *testing.T, tr http.RoundTripper, url string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", url+"/stream", nil)
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatalf("stream: %v", err)
	}
	if _, err := io.CopyN(io.Discard, resp.Body, 64<<10); err != nil {
		t.Fatalf("stream body: %v", err)
	}
	resp.Body.Close()
}

// TestAdvRefusedResetStreamDoesNotHoldTheCap: an upstream without a cap
// of its own, a fleet cap of 1. A client that gives up an endless stream
// leaves a failed connection; the upstream sends more than maxCloseDrain
// after the half-close, so closeAfterPeer resets the connection (the
// upstream lets it go at once) and then keeps its unit for the rest of
// failedWait (300ms here): the next GET, with 3s to live, is served. Once
// the upstream is known to enforce its cap (keyCap.enforcing), a failed
// connection waits up to maxRefusedHold for the upstream's close; a reset
// must not make it wait that long for nothing: the next GET is served as
// before.
func TestAdvRefusedResetStreamDoesNotHoldTheCap(t *testing.T) {
	up := startAdv2Upstream(t, time.Second)
	spec := testSpec
	spec.Path = filepath.Join(t.TempDir(), "seg")
	m := newMemberOpts(t, spec, NodeOptions{SweepInterval: 50 * time.Millisecond, FailedCloseWait: 300 * time.Millisecond},
		func(tr *Transport) { tr.MaxConnsPerKey = 1 })

	get := func(what string) {
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		if err := getBody(ctx, m.tr, up.url+"/ok"); err != nil {
			t.Errorf("%s: GET after a given-up stream failed after %v: %v", what, time.Since(start).Round(time.Millisecond), err)
		}
	}

	advCancelStream(t, m.tr, up.url)
	get("not enforcing")

	m.node.capOf(m.tr.last.Load().key).refusedAt.Store(sinceStart(time.Now()))
	advCancelStream(t, m.tr, up.url)
	get("enforcing")
}
