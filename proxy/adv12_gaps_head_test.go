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

// refusedHeadThroughSibling sends, through a sibling, a GET to path whose
// head mutate makes one the owner refuses, and checks that the refusal
// reaches the caller as the owner's failure before the request's deadline
// (20s), and that the owner's connection serves the sibling's next request.
// check runs in between, on the error and the sibling.
func refusedHeadThroughSibling(t *testing.T, path string, mutate func(*http.Request), check func(error, *member, *adv10Upstream)) {
	t.Helper()
	u := newAdv10Upstream(t, false, func(c net.Conn, br *bufio.Reader, req *http.Request, conn, n int) bool {
		return adv10Fresh(c, req, conn, n)
	})
	owner, client := remotePair(t, nil)
	warm(t, owner, u.url("/warm"))

	// The deadline bounds the test; a sibling that waits for it fails.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "GET", u.url(path), nil)
	if err != nil {
		t.Fatal(err)
	}
	mutate(req)
	resp, err := client.tr.RoundTrip(req)
	if resp != nil {
		resp.Body.Close()
		t.Fatalf("got %d through the sibling, want the owner's refusal", resp.StatusCode)
	}
	if ctx.Err() != nil || !errors.Is(err, ErrOwnerFailed) {
		t.Fatalf("err %v (context %v); want the owner's refusal of the head, before the deadline", err, ctx.Err())
	}
	check(err, client, u)
	// The owner's connection is free again: the next request through the
	// sibling is served on it.
	resp, body, err := adv10Do(t, client.tr, "GET", u.url("/after"), nil)
	adv10CheckOwn(t, "request after the refused head", resp, body, err, "/after")
}

// TestAdv12GapHeadTooLargeFailsFast: a sibling's request whose head is over
// the owner's limit (peerHeadLimit of the Transport's 10 MiB default here)
// on a freshly dialed stream. The owner reads no further than its limit and
// closes the stream; the sibling must be told why, at once, rather than take
// the closed stream for a dead owner, avoid it, and wait on the pool for the
// rest of its deadline (the only connection of the key is the owner's). The
// upstream sees nothing of it.
func TestAdv12GapHeadTooLargeFailsFast(t *testing.T) {
	refusedHeadThroughSibling(t, "/big", func(req *http.Request) {
		req.Header.Set("Cookie", strings.Repeat("c", defaultMaxHeaderBytes+(1<<20)))
	}, func(err error, _ *member, u *adv10Upstream) {
		if !errors.Is(err, ErrRequestHeaderTooLarge) {
			t.Errorf("err %v; want it to name ErrRequestHeaderTooLarge", err)
		}
		if IsRetrySafe(err) {
			t.Errorf("err %v is retry-safe: every owner would refuse the head again", err)
		}
		for _, r := range u.requests() {
			if strings.HasSuffix(r, " /big") {
				t.Errorf("the upstream saw %q", r)
			}
		}
	})
}

// TestAdv13RefusedHeadStreamNotPooled: an owner that refuses a sibling's
// request head (refuseHead: over its limit, or malformed) sends an error
// frame and closes the stream, for it cannot read past the head. A sibling
// whose write of the head went through reads that frame as its answer: the
// stream must not go back to its idle streams as if in step, where the next
// request would take a stream the owner is closing (its write then fails,
// or, in the moment before the close, its head is swallowed and a request
// that may not be replayed fails). Here the head is malformed (a request
// target with a space, which Request.Write sends and the owner's parser
// refuses), so the whole head is written before the owner answers.
func TestAdv13RefusedHeadStreamNotPooled(t *testing.T) {
	refusedHeadThroughSibling(t, "/x", func(req *http.Request) {
		req.URL.Opaque = "/a b"
	}, func(err error, client *member, _ *adv10Upstream) {
		if !errors.Is(err, errMalformedRequestHead) || strings.Count(err.Error(), errMalformedRequestHead.Error()) != 1 {
			t.Errorf("err %q; want it to name errMalformedRequestHead, once", err)
		}
		client.node.peers.mu.Lock()
		idle := 0
		for _, l := range client.node.peers.idle {
			idle += len(l)
		}
		client.node.peers.mu.Unlock()
		if idle != 0 {
			t.Errorf("%d idle stream(s) to the owner after it refused the head and closed the stream; want 0", idle)
		}
	})
}
