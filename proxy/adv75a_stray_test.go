package proxy

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// adv75aBig is larger than spliceMinBody, so that a sibling's plain-TCP
// response goes through the owner's splice path.
const adv75aBig = 70000

// adv75aStray is a whole extra response an upstream sends nobody asked for.
const adv75aStray = "HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nEVIL"

// TestAdv75aStrayAfterLongBodyNotReused: an upstream sends, after a complete
// response whose body is long enough to be spliced through a sibling's
// stream (and spans several full TLS records), a second response in the same
// write or a moment later; or after a chunked body with trailers. The next
// request, local or a sibling's, over plain TCP and TLS, must get its own
// answer, never "EVIL", and each such connection must be discarded.
func TestAdv75aStrayAfterLongBodyNotReused(t *testing.T) {
	later := newAdv10Later()
	big := strings.Repeat("x", adv75aBig)
	mk := func(t *testing.T, withTLS bool) *adv10Upstream {
		return newAdv10Upstream(t, withTLS, func(c net.Conn, br *bufio.Reader, req *http.Request, conn, n int) bool {
			switch req.URL.Path {
			case "/big-same":
				fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s%s", len(big), big, adv75aStray)
				return true
			case "/big-later":
				fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(big), big)
				time.Sleep(2 * time.Millisecond)
				io.WriteString(c, adv75aStray)
				later.sent()
				return true
			case "/chunk-trailer":
				io.WriteString(c, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-T\r\n\r\n5\r\nhello\r\n0\r\nX-T: v\r\n\r\n"+adv75aStray)
				return true
			}
			return adv10Fresh(c, req, conn, n)
		})
	}
	for _, path := range []string{"/big-same", "/big-later", "/chunk-trailer"} {
		t.Run(path[1:], func(t *testing.T) {
			adv10Paths(t, mk, func(t *testing.T, u *adv10Upstream, rt http.RoundTripper, owner *member) {
				const rounds = 3
				for round := range rounds {
					resp, body, err := adv10Do(t, rt, "GET", u.url(path), nil)
					if err != nil || resp.StatusCode != 200 {
						t.Fatalf("round %d: %s: %v %v", round, path, resp, err)
					}
					want := big
					if path == "/chunk-trailer" {
						want = "hello"
						if got := resp.Trailer.Get("X-T"); got != "v" {
							t.Fatalf("round %d: trailer X-T = %q, want v", round, got)
						}
					}
					if body != want {
						t.Fatalf("round %d: body of %d bytes, want %d", round, len(body), len(want))
					}
					if path == "/big-later" {
						later.wait(t)
					}
					time.Sleep(20 * time.Millisecond)
					for i := range 2 {
						resp, body, err := adv10Do(t, rt, "GET", u.url("/next"), nil)
						adv10CheckOwn(t, fmt.Sprintf("round %d, GET %d", round, i), resp, body, err, "/next")
					}
				}
				if n := u.conns.Load(); n != rounds+1 {
					t.Errorf("%d upstream connections, want %d (each stray response costs its connection)", n, rounds+1)
				}
			})
		})
	}
}

// TestAdv75aCloseSignalNotReused: an upstream that says its connection ends
// (Connection: close, or an HTTP/1.0 answer without keep-alive) but leaves it
// open and would answer on it. As with net/http, the next request, local or
// a sibling's, runs on a new connection (its first request there).
func TestAdv75aCloseSignalNotReused(t *testing.T) {
	mk := func(t *testing.T, withTLS bool) *adv10Upstream {
		return newAdv10Upstream(t, withTLS, func(c net.Conn, br *bufio.Reader, req *http.Request, conn, n int) bool {
			switch req.URL.Path {
			case "/close-kept":
				io.WriteString(c, "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok")
				return true
			case "/http10":
				io.WriteString(c, "HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok")
				return true
			}
			return adv10Fresh(c, req, conn, n)
		})
	}
	for _, path := range []string{"/close-kept", "/http10"} {
		t.Run(path[1:], func(t *testing.T) {
			adv10Paths(t, mk, func(t *testing.T, u *adv10Upstream, rt http.RoundTripper, owner *member) {
				for round := range 2 {
					resp, body, err := adv10Do(t, rt, "GET", u.url(path), nil)
					if err != nil || resp.StatusCode != 200 || body != "ok" {
						t.Fatalf("round %d: %s: %v %q %v", round, path, resp, body, err)
					}
					resp, body, err = adv10Do(t, rt, "GET", u.url("/next"), nil)
					adv10CheckOwn(t, fmt.Sprintf("round %d", round), resp, body, err, "/next")
					if !strings.Contains(body, " r1 ") {
						t.Fatalf("round %d: /next answered %q: a connection the upstream said it would close was reused", round, body)
					}
				}
			})
		})
	}
}

// TestAdv75aAbandonedBodyNotReusedOutOfStep: the caller reads part of a long
// response and then closes the body, or cancels its context. Whatever the
// transport does with the rest (discard the connection, or read it off), the
// next request, local or a sibling's, must get its own answer, never the
// rest of the abandoned body.
func TestAdv75aAbandonedBodyNotReusedOutOfStep(t *testing.T) {
	const size = 4 << 20
	mk := func(t *testing.T, withTLS bool) *adv10Upstream {
		return newAdv10Upstream(t, withTLS, func(c net.Conn, br *bufio.Reader, req *http.Request, conn, n int) bool {
			switch req.URL.Path {
			case "/huge", "/huge-cancel":
				fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n", size)
				chunk := []byte(strings.Repeat("HTTP/1.1 200 OK\r\n", 1024))
				for left := size; left > 0; {
					k := min(left, len(chunk))
					if _, err := c.Write(chunk[:k]); err != nil {
						return false
					}
					left -= k
				}
				return true
			}
			return adv10Fresh(c, req, conn, n)
		})
	}
	for _, path := range []string{"/huge", "/huge-cancel"} {
		t.Run(path[1:], func(t *testing.T) {
			adv10Paths(t, mk, func(t *testing.T, u *adv10Upstream, rt http.RoundTripper, owner *member) {
				for round := range 2 {
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					req, _ := http.NewRequestWithContext(ctx, "GET", u.url(path), nil)
					resp, err := rt.RoundTrip(req)
					if err != nil {
						cancel()
						t.Fatalf("round %d: %v", round, err)
					}
					buf := make([]byte, 3000)
					if _, err := io.ReadFull(resp.Body, buf); err != nil {
						cancel()
						t.Fatalf("round %d: reading the start: %v", round, err)
					}
					if path == "/huge-cancel" {
						cancel()
						time.Sleep(10 * time.Millisecond)
					}
					resp.Body.Close()
					cancel()
					for i := range 2 {
						resp, body, err := adv10Do(t, rt, "GET", u.url("/next"), nil)
						adv10CheckOwn(t, fmt.Sprintf("round %d, GET %d", round, i), resp, body, err, "/next")
					}
				}
			})
		})
	}
}
