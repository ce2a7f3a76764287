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

// TestAdv55PartialHeadIsFirstResponseByte: the other side of adv54's
// e38133d. An upstream that reads the whole request and answers with part
// of a head ("HTTP/1.1 2") or a line that is no HTTP, then closes. net/http
// and orbit's local path call GotFirstResponseByte (bytes of an answer
// came) and fail. Through a sibling the owner has sent its accept (its
// writer read the body) and then an error frame in place of the head,
// which must say that the upstream's bytes came (flagResponseBegan).
func TestAdv55PartialHeadIsFirstResponseByte(t *testing.T) {
	u := newAdv10Upstream(t, false, func(nc net.Conn, br *bufio.Reader, req *http.Request, conn, n int) bool {
		switch req.URL.Path {
		case "/partial":
			io.Copy(io.Discard, req.Body)
			io.WriteString(nc, "HTTP/1.1 2")
			return false
		case "/garbage":
			io.Copy(io.Discard, req.Body)
			io.WriteString(nc, "NOT HTTP AT ALL\r\n\r\n")
			return false
		}
		return adv10Fresh(nc, req, conn, n)
	})
	run := func(rt http.RoundTripper, path string) (bool, error) {
		var first atomic.Bool
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{GotFirstResponseByte: func() { first.Store(true) }})
		req, _ := http.NewRequestWithContext(ctx, "POST", u.url(path), io.NopCloser(strings.NewReader(strings.Repeat("x", 64<<10))))
		resp, err := rt.RoundTrip(req)
		if err == nil {
			drain(resp)
		}
		return first.Load(), err
	}
	ref := &http.Transport{}
	defer ref.CloseIdleConnections()
	local := localTransportMember(t, u.conf(nil))
	warm(t, local, u.url("/warm"))
	owner, client := remotePair(t, u.conf(nil))
	warm(t, owner, u.url("/warm"))
	for _, path := range []string{"/partial", "/garbage"} {
		if r, err := ref.RoundTrip(mustReq(t, u.url("/warm"))); err == nil {
			drain(r)
		}
		refFirst, refErr := run(ref, path)
		warm(t, local, u.url("/warm"))
		localFirst, localErr := run(local.tr, path)
		warm(t, owner, u.url("/warm"))
		sibFirst, sibErr := run(client.tr, path)
		if refErr == nil || localErr == nil || sibErr == nil {
			t.Fatalf("%s: want an error everywhere: net/http %v, local %v, sibling %v", path, refErr, localErr, sibErr)
		}
		if !refFirst || !localFirst {
			t.Fatalf("%s: reference changed: GotFirstResponseByte net/http %v, local %v", path, refFirst, localFirst)
		}
		if !sibFirst {
			t.Errorf("%s: the upstream sent bytes of an answer (net/http: %v; local: %v), but through a sibling GotFirstResponseByte was not called (error %v)", path, refErr, localErr, sibErr)
		}
	}
	if s := client.node.Stats(); s.ReusedRemote == 0 {
		t.Fatalf("the sibling's requests did not go through the owner: %+v", s)
	}
}
