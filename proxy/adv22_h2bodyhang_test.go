package proxy

import (
	"context"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/internal/grpcmsg"
	"golang.org/x/net/http2"
)

// TestAdv22H2SiblingStreamFailsAfterAcceptDoesNotHang: a sibling sends a
// streaming request (a pipe: the caller writes one message, then waits for
// the response head before writing more, as a bidi caller may) through the
// owner's HTTP/2 connection; the upstream takes the stream and its first
// bytes, then resets it (RST_STREAM INTERNAL_ERROR) without answering. The
// owner's stream fails after it accepted the body, so it closes the unix
// stream. The sibling's RoundTrip must return that failure promptly, as
// stock net/http's and the owner's own do, and not wait on the caller's
// body, which brings nothing more until a response comes.
func TestAdv22H2SiblingStreamFailsAfterAcceptDoesNotHang(t *testing.T) {
	up := newEarlyResetH2(t)
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	stock := &http.Transport{Protocols: &p}
	defer stock.CloseIdleConnections()
	owner, client := remotePair(t, h2cConf)
	if err := adv21Get(owner.tr, context.Background(), up.url+"/"); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		rt   http.RoundTripper
	}{{"stock", stock}, {"owner", owner.tr}, {"sibling", client.tr}} {
		pr, pw := io.Pipe()
		req := grpcReq(t, context.Background(), up.url+"/early-rst", pr)
		got, errc := headAsync(tc.rt, req)
		go pw.Write(grpcmsg.Frame([]byte("hello")))
		start := time.Now()
		select {
		case resp := <-got:
			resp.Body.Close()
			t.Errorf("%s: a response (%s) from an upstream that reset the stream", tc.name, resp.Status)
		case err := <-errc:
			t.Logf("h2Wrapped=%v %s: failed in %v: %v", h2Wrapped, tc.name, time.Since(start).Round(time.Millisecond), err)
		case <-time.After(3 * time.Second):
			t.Errorf("h2Wrapped=%v %s: RoundTrip still running 3s after the upstream reset the stream (ReusedRemote %d)",
				h2Wrapped, tc.name, client.node.Stats().ReusedRemote)
		}
		pw.Close()
	}
}

// TestAdv22H2SiblingStreamFailsAfterAcceptHonoursContext: as above, with a
// 1s deadline on the sibling's request: RoundTrip returns by then.
func TestAdv22H2SiblingStreamFailsAfterAcceptHonoursContext(t *testing.T) {
	up := newEarlyResetH2(t)
	owner, client := remotePair(t, h2cConf)
	if err := adv21Get(owner.tr, context.Background(), up.url+"/"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	pr, pw := io.Pipe()
	defer pw.Close()
	req := grpcReq(t, ctx, up.url+"/early-rst", pr)
	got, errc := headAsync(client.tr, req)
	go pw.Write(grpcmsg.Frame([]byte("hello")))
	start := time.Now()
	select {
	case resp := <-got:
		resp.Body.Close()
		t.Errorf("a response (%s) from an upstream that reset the stream", resp.Status)
	case err := <-errc:
		t.Logf("h2Wrapped=%v sibling: failed in %v: %v", h2Wrapped, time.Since(start).Round(time.Millisecond), err)
	case <-time.After(3 * time.Second):
		t.Errorf("h2Wrapped=%v sibling: RoundTrip still running 3s after the upstream reset the stream, 2s past its 1s deadline", h2Wrapped)
	}
}

// newEarlyResetH2 is an HTTP/2 upstream that resets /early-rst 100ms after
// its head arrives, its body unread and unanswered, and answers "ok"
// otherwise.
func newEarlyResetH2(t *testing.T) *rawH2 {
	return newRawH2(t, func(s *rawStream) {
		if s.path == "/early-rst" {
			time.Sleep(100 * time.Millisecond)
			s.rst(http2.ErrCodeInternal)
			return
		}
		s.headers(false, ":status", "200")
		s.data(true, []byte("ok"))
	})
}
