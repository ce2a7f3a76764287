package proxy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestAdv10EarlyRejectWhileBodyStreams: an upstream answers 413 as soon as
// it has a POST's head, while the body (1 MiB, not replayable) is still on
// its way, locally or from a sibling through the owner. Then:
//
//   - drain: it reads the rest of the body and keeps the connection, as
//     net/http's server does; the connection may carry the next request;
//   - close: it asks to close and stops reading;
//   - unread: it keeps the connection but never reads the body, so a
//     client that sent the next request on it would have it read as part
//     of the body, and whatever it then reads as a request is answered 400.
//     The body (16 MiB) is more than the sockets' buffers hold: a body the
//     kernel takes whole counts as sent, and net/http then reuses the
//     connection too (maxWriteWaitBeforeConnReuse);
//   - silent: it keeps the connection, reads nothing more and says nothing
//     more until the test ends: the client must give the stalled write up
//     (as net/http does after 50ms), or the key's one connection stays
//     busy and the next request waits for it until its deadline.
//
// Whatever the upstream does, the POST reached it once, the 413 is what the
// caller gets, and the next requests each get their own answer.
func TestAdv10EarlyRejectWhileBodyStreams(t *testing.T) {
	mk := func(t *testing.T, withTLS bool) *adv10Upstream {
		release := make(chan struct{})
		u := newAdv10Upstream(t, withTLS, func(c net.Conn, br *bufio.Reader, req *http.Request, conn, n int) bool {
			switch req.URL.Path {
			case "/silent":
				io.WriteString(c, "HTTP/1.1 413 Payload Too Large\r\nContent-Length: 3\r\n\r\nbig")
				select {
				case <-release:
				case <-time.After(10 * time.Second):
				}
				return false
			case "/drain":
				io.WriteString(c, "HTTP/1.1 413 Payload Too Large\r\nContent-Length: 3\r\n\r\nbig")
				_, err := io.Copy(io.Discard, req.Body)
				return err == nil
			case "/close":
				io.WriteString(c, "HTTP/1.1 413 Payload Too Large\r\nConnection: close\r\nContent-Length: 3\r\n\r\nbig")
				time.Sleep(20 * time.Millisecond)
				return false
			case "/unread":
				io.WriteString(c, "HTTP/1.1 413 Payload Too Large\r\nContent-Length: 3\r\n\r\nbig")
				// The next thing on the connection should be a request;
				// the unread body is not one.
				nr, err := http.ReadRequest(br)
				if err != nil {
					io.WriteString(c, "HTTP/1.1 400 Bad Request\r\nConnection: close\r\nContent-Length: 11\r\n\r\nout of step")
					// Not at once: a reset would race the client's read
					// of the 413.
					time.Sleep(200 * time.Millisecond)
					return false
				}
				return adv10Fresh(c, nr, conn, n+1)
			}
			return adv10Fresh(c, req, conn, n)
		})
		// Before the upstream's own cleanup, which waits for its
		// connections' goroutines.
		t.Cleanup(func() { close(release) })
		return u
	}
	for _, path := range []string{"/drain", "/close", "/unread", "/silent"} {
		size := 1 << 20
		if path == "/unread" || path == "/silent" {
			size = 16 << 20
		}
		t.Run(path[1:], func(t *testing.T) {
			adv10Paths(t, mk, func(t *testing.T, u *adv10Upstream, rt http.RoundTripper, owner *member) {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				req := postNoReplay(t, u.url(path), size)
				resp, err := rt.RoundTrip(req.WithContext(ctx))
				if err != nil {
					t.Fatalf("POST: %v", err)
				}
				b, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 413 || string(b) != "big" || err != nil {
					t.Fatalf("POST: %d %q %v", resp.StatusCode, b, err)
				}
				for i := range 3 {
					resp, body, err := adv10Do(t, rt, "GET", u.url("/next"), nil)
					adv10CheckOwn(t, fmt.Sprintf("GET %d", i), resp, body, err, "/next")
				}
				var posts, nexts int
				for _, r := range u.requests() {
					switch {
					case strings.HasSuffix(r, " POST "+path):
						posts++
					case strings.HasSuffix(r, " GET /next"):
						nexts++
					case strings.HasSuffix(r, " GET /warm"):
					default:
						t.Errorf("the upstream read a request nobody sent: %q", r)
					}
				}
				if posts != 1 || nexts != 3 {
					t.Errorf("upstream read %d POSTs and %d GETs, want 1 and 3: %q", posts, nexts, u.requests())
				}
			})
		})
	}
}

// adv10Outcome is what a caller sees of one exchange, for comparison with
// net/http.
type adv10Outcome struct {
	Err    bool
	Status int
	Body   string
	CL     int64
	TE     []string
}

func adv10Observe(t *testing.T, rt http.RoundTripper, url string) (adv10Outcome, error) {
	t.Helper()
	resp, body, err := adv10Do(t, rt, "GET", url, nil)
	if err != nil {
		return adv10Outcome{Err: true}, err
	}
	return adv10Outcome{Status: resp.StatusCode, Body: body, CL: resp.ContentLength, TE: resp.TransferEncoding}, nil
}

// TestAdv10ConflictingLengthsLikeNetHTTP: response framings a desync lives
// on (Content-Length with Transfer-Encoding, duplicate and differing
// lengths, codings net/http does not take, odd line endings). On the local
// path and through a sibling, each reads as net/http's Transport reads it
// (the same answer, or an error where it errs, of the same class locally
// and remotely), and the next request on the key gets its own answer: no
// byte the framing left over is taken for it.
func TestAdv10ConflictingLengthsLikeNetHTTP(t *testing.T) {
	cases := map[string]string{
		"/cl-te":         "HTTP/1.1 200 OK\r\nContent-Length: 100\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
		"/te-cl":         "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
		"/cl-dup-same":   "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello",
		"/cl-dup-diff":   "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 7\r\n\r\nhello, ",
		"/cl-list":       "HTTP/1.1 200 OK\r\nContent-Length: 5, 5\r\n\r\nhello",
		"/cl-plus":       "HTTP/1.1 200 OK\r\nContent-Length: +5\r\n\r\nhello",
		"/te-gzip-chunk": "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
		"/te-identity":   "HTTP/1.1 200 OK\r\nTransfer-Encoding: identity\r\nContent-Length: 5\r\n\r\nhello",
		"/te-twice":      "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
		"/bare-lf":       "HTTP/1.1 200 OK\nContent-Length: 5\n\nhello",
		"/obs-fold":      "HTTP/1.1 200 OK\r\nX-Folded: a\r\n b\r\nContent-Length: 5\r\n\r\nhello",
		"/chunk-ext":     "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;x=\"a\r\nb\"\r\nhello\r\n0\r\n\r\n",
		"/chunk-size-ws": "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5 \r\nhello\r\n0\r\n\r\n",
		"/http10-te":     "HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\nhello",
	}
	names := make([]string, 0, len(cases))
	for p := range cases {
		names = append(names, p)
	}
	slices.Sort(names)
	mk := func(t *testing.T, withTLS bool) *adv10Upstream {
		return newAdv10Upstream(t, withTLS, func(c net.Conn, br *bufio.Reader, req *http.Request, conn, n int) bool {
			if raw, ok := cases[req.URL.Path]; ok {
				// Then whatever follows: the connection stays open, so a
				// client that reuses it after a framing it misread reads
				// the rest as the next answer.
				io.WriteString(c, raw+"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nLEFT-OVER")
				return true
			}
			return adv10Fresh(c, req, conn, n)
		})
	}
	want := make(map[string]adv10Outcome)
	{
		u := mk(t, false)
		ref := u.refTransport(t)
		// A connection per case: net/http reuses a connection as soon as
		// the response is read, and its check for bytes left over runs
		// in its read loop meanwhile, so that a request sent at once
		// may read the bytes another exchange left (it did: "LEFT-OVER"
		// as the answer to /chunk-ext or /http10-te, now and then).
		ref.DisableKeepAlives = true
		for _, p := range names {
			o, err := adv10Observe(t, ref, u.url(p))
			want[p] = o
			t.Logf("net/http %s: %+v %v", p, o, err)
		}
	}
	adv10Paths(t, mk, func(t *testing.T, u *adv10Upstream, rt http.RoundTripper, owner *member) {
		for _, p := range names {
			got, err := adv10Observe(t, rt, u.url(p))
			w := want[p]
			if got.Err != w.Err || (!w.Err && (got.Status != w.Status || got.Body != w.Body)) {
				t.Errorf("%s: got %+v (%v), net/http %+v", p, got, err, w)
			}
			if err != nil && !errors.Is(err, ErrBadResponse) && !errors.Is(err, ErrConnBroken) {
				t.Errorf("%s: error %v, want ErrBadResponse or ErrConnBroken", p, err)
			}
			resp, body, err := adv10Do(t, rt, "GET", u.url("/next"), nil)
			adv10CheckOwn(t, "GET after "+p, resp, body, err, "/next")
		}
	})
}
