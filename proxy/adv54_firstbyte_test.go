package proxy

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestAdv54ErrFrameIsNoFirstResponseByte: an upstream that reads the whole
// request and closes without a byte of answer. net/http and orbit's local
// path fail without calling the trace's GotFirstResponseByte: nothing came.
// Through a sibling the owner has sent its accept (its writer read the
// body) and, since 406583b, an error frame in place of the head; the
// sibling's reader peeked a byte after the accept, found the frame's, and
// told the caller the first response byte arrived.
func TestAdv54ErrFrameIsNoFirstResponseByte(t *testing.T) {
	u := newAdv10Upstream(t, false, func(nc net.Conn, br *bufio.Reader, req *http.Request, conn, n int) bool {
		if req.URL.Path != "/mute" {
			return adv10Fresh(nc, req, conn, n)
		}
		io.Copy(io.Discard, req.Body)
		return false
	})
	run := func(rt http.RoundTripper) (bool, error) {
		var first atomic.Bool
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{GotFirstResponseByte: func() { first.Store(true) }})
		// A body of unknown length: it streams after the head (and, on
		// the unix leg, after the owner's accept).
		req, _ := http.NewRequestWithContext(ctx, "POST", u.url("/mute"), io.NopCloser(strings.NewReader(strings.Repeat("x", 64<<10))))
		resp, err := rt.RoundTrip(req)
		if err == nil {
			drain(resp)
		}
		return first.Load(), err
	}
	ref := &http.Transport{}
	defer ref.CloseIdleConnections()
	if r, err := ref.RoundTrip(mustReq(t, u.url("/warm"))); err == nil {
		drain(r)
	}
	refFirst, refErr := run(ref)
	local := localTransportMember(t, u.conf(nil))
	warm(t, local, u.url("/warm"))
	localFirst, localErr := run(local.tr)
	owner, client := remotePair(t, u.conf(nil))
	warm(t, owner, u.url("/warm"))
	sibFirst, sibErr := run(client.tr)
	if s := client.node.Stats(); s.ReusedRemote == 0 {
		t.Fatalf("the sibling's request did not go through the owner: %+v", s)
	}
	if refErr == nil || localErr == nil || sibErr == nil {
		t.Fatalf("want an error everywhere: net/http %v, local %v, sibling %v", refErr, localErr, sibErr)
	}
	if refFirst || localFirst {
		t.Fatalf("reference changed: GotFirstResponseByte net/http %v, local %v", refFirst, localFirst)
	}
	if sibFirst {
		t.Errorf("no byte of answer came from the upstream (net/http: %v; local: %v), but through a sibling GotFirstResponseByte was called (error %v)", refErr, localErr, sibErr)
	}
}

func mustReq(t *testing.T, url string) *http.Request {
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	return req
}
