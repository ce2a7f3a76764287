package proxy

import (
	"bufio"
	"context"
	"errors"
	"net"
	"net/http"
	"testing"
	"time"
)

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
	u := newAdv10Upstream(t, false, func(c net.Conn, br *bufio.Reader, req *http.Request, conn, n int) bool {
		return adv10Fresh(c, req, conn, n)
	})
	owner, client := remotePair(t, nil)
	warm(t, owner, u.url("/warm"))

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "GET", u.url("/x"), nil)
	if err != nil {
		t.Fatal(err)
	}
	req.URL.Opaque = "/a b"
	resp, err := client.tr.RoundTrip(req)
	if resp != nil {
		resp.Body.Close()
		t.Fatalf("got %d through the sibling, want the owner's refusal", resp.StatusCode)
	}
	if !errors.Is(err, ErrOwnerFailed) {
		t.Fatalf("err %v; want the owner's refusal of the head", err)
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
	resp, body, err := adv10Do(t, client.tr, "GET", u.url("/after"), nil)
	adv10CheckOwn(t, "request after the refused head", resp, body, err, "/after")
}
