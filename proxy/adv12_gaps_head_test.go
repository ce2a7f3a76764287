package proxy

import (
	"bufio"
	"context"
	"errors"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestAdv12GapHeadTooLargeFailsFast: a sibling's request whose head is over
// the owner's limit (peerHeadLimit of the Transport's 10 MiB default here)
// on a freshly dialed stream. The owner reads no further than its limit and
// closes the stream; the sibling must be told why, at once, rather than take
// the closed stream for a dead owner, avoid it, and wait on the pool for the
// rest of its deadline (the only connection of the key is the owner's). The
// upstream sees nothing of it.
func TestAdv12GapHeadTooLargeFailsFast(t *testing.T) {
	u := newAdv10Upstream(t, false, func(c net.Conn, br *bufio.Reader, req *http.Request, conn, n int) bool {
		return adv10Fresh(c, req, conn, n)
	})
	owner, client := remotePair(t, nil)
	warm(t, owner, u.url("/warm"))

	// The deadline bounds the test; a sibling that waits for it fails.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "GET", u.url("/big"), nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Cookie", strings.Repeat("c", defaultMaxHeaderBytes+(1<<20)))
	resp, err := client.tr.RoundTrip(req)
	if resp != nil {
		resp.Body.Close()
		t.Fatalf("got %d through the sibling, want an error", resp.StatusCode)
	}
	if ctx.Err() != nil || !errors.Is(err, ErrRequestHeaderTooLarge) || !errors.Is(err, ErrOwnerFailed) {
		t.Fatalf("err %v (context %v); want the owner's failure naming ErrRequestHeaderTooLarge, before the deadline", err, ctx.Err())
	}
	if IsRetrySafe(err) {
		t.Errorf("err %v is retry-safe: every owner would refuse the head again", err)
	}
	for _, r := range u.requests() {
		if strings.HasSuffix(r, " /big") {
			t.Errorf("the upstream saw %q", r)
		}
	}
	// The owner's connection is free again: the next request through the
	// sibling is served on it.
	resp, body, err := adv10Do(t, client.tr, "GET", u.url("/after"), nil)
	adv10CheckOwn(t, "request after the refused head", resp, body, err, "/after")
}
