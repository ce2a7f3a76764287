package proxy

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestAdv75aOwnerCloseMidResponseBody: a sibling is reading a response body
// that the owner relays from its upstream connection (with a length, chunked,
// or running to the upstream's close) when the owner's Node closes. The body
// the sibling reads must never look complete when it is not: either it reads
// the whole body, or its read fails. A close-delimited body that the owner
// re-frames must not end as a clean EOF because the owner went away. Close
// and the reads end in bounded time.
func TestAdv75aOwnerCloseMidResponseBody(t *testing.T) {
	const first = 100
	const rest = 5000
	for _, path := range []string{"/cl", "/chunked", "/close"} {
		t.Run(path[1:], func(t *testing.T) {
			u, rel := adv75aHeldUpstream(t, first, rest, nil)
			owner, client := remotePair(t, nil)
			warm(t, owner, u.url("/warm"))
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, "GET", u.url(path), nil)
			resp, err := client.tr.RoundTrip(req)
			if err != nil {
				t.Fatalf("RoundTrip: %v", err)
			}
			defer resp.Body.Close()
			if owner.node.Stats().ServedRemote == 0 {
				t.Fatalf("the request did not go through the owner")
			}
			buf := make([]byte, first)
			if _, err := io.ReadFull(resp.Body, buf); err != nil {
				t.Fatalf("reading the first bytes: %v", err)
			}
			closed := make(chan error, 1)
			go func() { closed <- owner.node.Close() }()
			// The upstream sends the rest a moment later: an owner whose
			// Close waits for the exchange relays it whole.
			time.AfterFunc(300*time.Millisecond, rel)
			type result struct {
				b   []byte
				err error
			}
			got := make(chan result, 1)
			go func() {
				b, err := io.ReadAll(resp.Body)
				got <- result{b, err}
			}()
			var r result
			select {
			case r = <-got:
			case <-time.After(10 * time.Second):
				t.Fatal("the sibling's body read hung after the owner closed")
			}
			select {
			case <-closed:
			case <-time.After(10 * time.Second):
				t.Fatal("the owner's Close hung")
			}
			if r.err == nil && (len(r.b) != rest || !bytes.Equal(r.b, bytes.Repeat([]byte("b"), rest))) {
				t.Fatalf("the body ended cleanly after %d of %d remaining bytes: a truncated body read as complete", len(r.b), rest)
			}
			t.Logf("body after Close: %d bytes, err %v", len(r.b), r.err)
		})
	}
}

// adv75aGatedBody gives its first part at once, then blocks until gate is
// closed (or the exchange closes it), then gives the rest.
type adv75aGatedBody struct {
	first, rest []byte
	gate        <-chan struct{}
	closed      chan struct{}
	closedOnce  atomic.Bool
}

func (b *adv75aGatedBody) Read(p []byte) (int, error) {
	if len(b.first) > 0 {
		n := copy(p, b.first)
		b.first = b.first[n:]
		return n, nil
	}
	select {
	case <-b.gate:
	case <-b.closed:
		return 0, io.ErrClosedPipe
	}
	if len(b.rest) == 0 {
		return 0, io.EOF
	}
	n := copy(p, b.rest)
	b.rest = b.rest[n:]
	return n, nil
}

func (b *adv75aGatedBody) Close() error {
	if b.closedOnce.CompareAndSwap(false, true) {
		close(b.closed)
	}
	return nil
}

// TestAdv75aOwnerCloseMidRequestBody: a sibling's POST body is half sent to
// the upstream through the owner when the owner's Node closes. The
// sibling's RoundTrip ends in bounded time; the upstream sees the POST once
// (its bytes reached the upstream: it is never replayed, even though the
// request could be rewound with GetBody); an error is not retry-safe; and
// no later request on the sibling is answered with this POST's response.
func TestAdv75aOwnerCloseMidRequestBody(t *testing.T) {
	var uploads atomic.Int32
	arrived := make(chan struct{}, 4)
	u := newAdv10Upstream(t, false, func(c net.Conn, br *bufio.Reader, req *http.Request, conn, n int) bool {
		if req.URL.Path == "/upload" {
			uploads.Add(1)
			arrived <- struct{}{}
			b, err := io.ReadAll(req.Body)
			if err != nil {
				return false
			}
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len("upload"), "upload")
			_ = b
			return true
		}
		return adv10Fresh(c, req, conn, n)
	})
	owner, client := remotePair(t, nil)
	warm(t, owner, u.url("/warm"))
	gate := make(chan struct{})
	var gateOnce atomic.Bool
	open := func() {
		if gateOnce.CompareAndSwap(false, true) {
			close(gate)
		}
	}
	t.Cleanup(open)
	mkBody := func() *adv75aGatedBody {
		return &adv75aGatedBody{first: bytes.Repeat([]byte("f"), 1000), rest: bytes.Repeat([]byte("r"), 1000), gate: gate, closed: make(chan struct{})}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", u.url("/upload"), nil)
	req.Body = mkBody()
	req.ContentLength = 2000
	req.GetBody = func() (io.ReadCloser, error) { return mkBody(), nil }
	type result struct {
		resp *http.Response
		err  error
	}
	done := make(chan result, 1)
	go func() {
		resp, err := client.tr.RoundTrip(req)
		done <- result{resp, err}
	}()
	select {
	case <-arrived:
	case <-time.After(5 * time.Second):
		t.Fatal("the POST did not reach the upstream")
	}
	time.Sleep(50 * time.Millisecond)
	closed := make(chan error, 1)
	go func() { closed <- owner.node.Close() }()
	time.AfterFunc(300*time.Millisecond, open)
	var r result
	select {
	case r = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the sibling's POST hung after the owner closed")
	}
	if r.resp != nil {
		b, err := io.ReadAll(r.resp.Body)
		r.resp.Body.Close()
		if err == nil && string(b) != "upload" {
			t.Fatalf("POST answered %q", b)
		}
	}
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("the owner's Close hung")
	}
	time.Sleep(200 * time.Millisecond)
	if n := uploads.Load(); n != 1 {
		t.Fatalf("the upstream saw the POST %d times (sibling's error: %v)", n, r.err)
	}
	if r.err != nil && IsRetrySafe(r.err) {
		t.Fatalf("retry-safe error for a POST whose bytes reached the upstream: %v", r.err)
	}
	resp, body, err := adv10Do(t, client.tr, "GET", u.url("/next"), nil)
	adv10CheckOwn(t, "GET after the owner closed", resp, body, err, "/next")
}

// adv75aHeldUpstream serves /cl, /chunked and /close with first bytes of a
// body (of declared length, chunked, or to the connection's close), and the
// rest bytes only once release is called (also at the test's end); other
// paths go to other, if set, then to adv10Fresh.
func adv75aHeldUpstream(t *testing.T, first, rest int, other func(c net.Conn, req *http.Request) (keep, handled bool)) (*adv10Upstream, func()) {
	release := make(chan struct{})
	var released atomic.Bool
	rel := func() {
		if released.CompareAndSwap(false, true) {
			close(release)
		}
	}
	t.Cleanup(rel)
	a, b := strings.Repeat("a", first), strings.Repeat("b", rest)
	u := newAdv10Upstream(t, false, func(c net.Conn, br *bufio.Reader, req *http.Request, conn, n int) bool {
		switch req.URL.Path {
		case "/cl":
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", first+rest, a)
			<-release
			io.WriteString(c, b)
			return true
		case "/chunked":
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n", first, a)
			<-release
			fmt.Fprintf(c, "%x\r\n%s\r\n0\r\n\r\n", rest, b)
			return true
		case "/close":
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\n\r\n%s", a)
			<-release
			io.WriteString(c, b)
			return false
		}
		if other != nil {
			if keep, handled := other(c, req); handled {
				return keep
			}
		}
		return adv10Fresh(c, req, conn, n)
	})
	return u, rel
}
