package proxy

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/textproto"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/orbitpool"
)

// streamPair is a connected pair of unix streams: a sibling's end and an
// owner's.
func streamPair(t testing.TB) (sib, own *net.UnixConn) {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	mk := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "stream")
		defer f.Close()
		nc, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		return nc.(*net.UnixConn)
	}
	return mk(fds[0]), mk(fds[1])
}

// deadStream is a unix stream whose other end (the owner) has already
// closed: what a pooled stream to a sibling that died or restarted is.
func deadStream(t testing.TB) *net.UnixConn {
	t.Helper()
	sib, own := streamPair(t)
	own.Close()
	return sib
}

// slowFirstWrite holds its first Write a moment before making it (the
// writer goroutine descheduled inside countWriter.Write, after the count
// went up and before the kernel answered), and lets the reader see the
// stream's end only once that write is under way.
type slowFirstWrite struct {
	*net.UnixConn
	held    bool
	entered chan struct{}
	d       time.Duration
}

func (c *slowFirstWrite) Write(p []byte) (int, error) {
	if !c.held {
		c.held = true
		close(c.entered)
		time.Sleep(c.d)
	}
	return c.UnixConn.Write(p)
}

func (c *slowFirstWrite) Read(p []byte) (int, error) {
	select {
	case <-c.entered:
	case <-time.After(5 * time.Second):
	}
	return c.UnixConn.Read(p)
}

// staleRoundTrip sends a POST with a body on a pooled stream to an owner
// that is gone, as peers.roundTrip does with a stream from its idle list.
func staleRoundTrip(t testing.TB, nc net.Conn, raw net.Conn) error {
	t.Helper()
	p := newPeers(t.TempDir(), 0)
	c := newConn(nc, raw)
	c.requests = 1 // it carried an exchange before
	c.idleAt = time.Now()
	const lane = 3
	p.idle[lane] = []*conn{c}
	req, _ := http.NewRequest("POST", "http://upstream.test/sink", strings.NewReader("not replayable by method"))
	resp, err := p.roundTrip(req, lane, orbitpool.Lease{}, &remoteOpts{}, 1, nil)
	if err == nil {
		resp.Body.Close()
		t.Fatal("a request through a dead owner's stream succeeded")
	}
	return err
}

// TestStaleStreamWriteUnderWayIsRetrySafe: a POST on a pooled stream to an
// owner that has gone: the kernel takes none of it (EPIPE, or the stream is
// closed under the write), so nothing can have reached the upstream and the
// request may go on another plan whatever its method (a stale stream is the
// case flagged in THREATS.md). The response reader finds the stream at EOF
// while the writer is still inside its Write; since countWriter counts a
// write under way as written, the reader must not settle RetrySafe before
// the writer has stopped and the count is exact.
func TestStaleStreamWriteUnderWayIsRetrySafe(t *testing.T) {
	uc := deadStream(t)
	err := staleRoundTrip(t, &slowFirstWrite{UnixConn: uc, entered: make(chan struct{}), d: 100 * time.Millisecond}, uc)
	var pe *Error
	if !errors.As(err, &pe) || !pe.RetrySafe {
		t.Fatalf("nothing of the POST went out, yet %v is not retry-safe: the transport gives up on it", err)
	}
}

// TestStaleStreamPOSTAlwaysRetrySafe: the same on real sockets, without any
// injected delay: the reader and the writer race on their own, and a POST
// must come back retry-safe every time, not most of the time.
func TestStaleStreamPOSTAlwaysRetrySafe(t *testing.T) {
	if testing.Short() {
		t.Skip("10000 exchanges")
	}
	const n = 10000
	bad := 0
	var last error
	for range n {
		uc := deadStream(t)
		err := staleRoundTrip(t, uc, uc)
		var pe *Error
		if !errors.As(err, &pe) || !pe.RetrySafe {
			bad++
			last = err
		}
	}
	if bad > 0 {
		t.Fatalf("%d of %d POSTs on a dead owner's stream, of which the kernel took nothing, came back not retry-safe (last: %v)", bad, n, last)
	}
}

// TestExpectContinueNudgeLeavesBodyUnread: with no wait for the upstream's
// 100, the sibling reads zero bytes of an Expect: 100-continue body first,
// so that the client is told to continue. That read takes nothing from the
// body: when the attempt then fails with nothing sent (a dead owner's stream
// here), the request may still go elsewhere, though it has no GetBody.
func TestExpectContinueNudgeLeavesBodyUnread(t *testing.T) {
	uc := deadStream(t)
	p := newPeers(t.TempDir(), 0)
	c := newConn(uc, uc)
	c.requests = 1
	c.idleAt = time.Now()
	const lane = 3
	p.idle[lane] = []*conn{c}
	tb := &trackBody{rc: io.NopCloser(strings.NewReader("payload"))}
	req, _ := http.NewRequest("POST", "http://upstream.test/sink", tb)
	req.ContentLength = int64(len("payload"))
	req.Header.Set("Expect", "100-continue")
	_, err := p.roundTrip(req, lane, orbitpool.Lease{}, &remoteOpts{}, 1, nil)
	if !IsRetrySafe(err) {
		t.Fatalf("nothing went out, yet %v is not retry-safe", err)
	}
	if _, again := rewind(req, req, tb, err); !again {
		t.Fatalf("the request is not sent again after %v: its body counts as read", err)
	}
}

// TestInterimSentThenOwnerGoneIsNotReplayed: the owner relays a 1xx (103
// Early Hints, say), which the caller's trace passes on to its client, and
// is then killed. Something of the answer has reached the client, so the
// request is not the "reused connection lost before any byte of the
// answer" that may be sent again, whatever its method: readError knows it
// (gotByte), but when the request writer failed first and the reader was
// still busy with the 1xx, the writer's abort, classified by writeError as
// replayable, is what the reader returns.
func TestInterimSentThenOwnerGoneIsNotReplayed(t *testing.T) {
	sib, own := streamPair(t)
	defer sib.Close()

	// The owner: reads the request head, accepts, relays a 103, and dies.
	go func() {
		defer own.Close()
		var got []byte
		buf := make([]byte, 4096)
		for !strings.Contains(string(got), "\r\n\r\n") {
			n, err := own.Read(buf)
			if err != nil {
				return
			}
			got = append(got, buf[:n]...)
		}
		out := appendResponseFrame(nil, responseFrame{typ: frameAccept})
		out = appendHead(out, 0)
		out = append(out, "HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n"...)
		own.Write(out)
	}()

	p := newPeers(t.TempDir(), 0)
	c := newConn(sib, sib)
	c.idleAt = time.Now()
	const lane = 3
	p.idle[lane] = []*conn{c}

	pr, pw := io.Pipe()
	req, _ := http.NewRequest("GET", "http://upstream.test/search", pr)
	req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(strings.NewReader("q")), nil }
	got1xx := false
	trace := &httptrace.ClientTrace{Got1xxResponse: func(code int, h textproto.MIMEHeader) error {
		// The client is sent the 103; the request body ends meanwhile,
		// and its end goes to a stream the owner has closed. Sending
		// the 103 to a slow client takes a moment.
		got1xx = true
		pw.Close()
		time.Sleep(200 * time.Millisecond)
		return nil
	}}
	req = req.WithContext(httptrace.WithClientTrace(req.Context(), trace))
	resp, err := p.roundTrip(req, lane, orbitpool.Lease{}, &remoteOpts{}, 1, nil)
	if err == nil {
		resp.Body.Close()
		t.Fatal("an exchange whose owner died succeeded")
	}
	if !got1xx {
		t.Fatalf("no 1xx reached the caller: %v", err)
	}
	if _, again := rewind(req, req, nil, err); again {
		t.Fatalf("a 103 reached the client, then %v: and the request is sent again", err)
	}
}

// TestOwnerSIGKILLedBeforeAnswer: the owner process is killed -9 (no
// graceful Close, its lane left in the table for the kernel to release)
// while a sibling's request waits for the upstream's answer on the owner's
// connection. A GET is sent again and answered, on a connection of the
// sibling's own; a POST, which reached the upstream, fails and is not sent
// again, whether its body streamed, went whole with its head, or it had
// none: the owner had read all of it, so its stream ends without a reset.
func TestOwnerSIGKILLedBeforeAnswer(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test")
	}
	for _, tc := range []struct {
		name string
		req  func(url string) *http.Request
	}{
		{"GET", func(url string) *http.Request { r, _ := http.NewRequest("GET", url, nil); return r }},
		{"POST streamed", func(url string) *http.Request {
			r, _ := http.NewRequest("POST", url, io.NopCloser(strings.NewReader("payload")))
			return r
		}},
		{"POST body with head", func(url string) *http.Request { return postOnce(url, "short") }},
		{"POST no body", func(url string) *http.Request { r, _ := http.NewRequest("POST", url, nil); return r }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var hits atomic.Int32
			arrived, release := make(chan struct{}), make(chan struct{})
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == "/hang" {
					io.Copy(io.Discard, r.Body)
					if hits.Add(1) == 1 {
						close(arrived)
						select {
						case <-release:
						case <-r.Context().Done():
						}
						return
					}
				}
				io.WriteString(w, "ok")
			}))
			defer srv.Close()
			defer close(release)
			seg := filepath.Join(t.TempDir(), "seg")
			owner := startChild(t, seg, srv.URL, 0, 1)
			owner.send(t, "warm 1")
			if got := owner.expect(t, "warmed"); got != "1" {
				t.Fatalf("owner made %s connections", got)
			}
			spec := testSpec
			spec.Path = seg
			me := newMember(t, spec, func(tr *Transport) { tr.MaxConnsPerKey = 1 })

			req := tc.req(srv.URL + "/hang")
			done := sendAsync(me.tr, req)
			select {
			case <-arrived:
			case <-time.After(10 * time.Second):
				t.Fatal("the request never reached the upstream")
			}
			if err := owner.cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			var r roundTripResult
			select {
			case r = <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("the request hung after its owner was killed")
			}
			st := me.node.Stats()
			if st.ReusedRemote < 1 {
				t.Fatalf("not sent through the owner: %+v", st)
			}
			if req.Method == "POST" {
				if r.err == nil || hits.Load() != 1 {
					t.Fatalf("a POST that reached the upstream: %q, %v; the upstream saw it %d times", r.body, r.err, hits.Load())
				}
				return
			}
			if r.err != nil || r.body != "ok" || hits.Load() != 2 {
				t.Fatalf("GET: %q, %v, the upstream saw it %d times; stats %+v", r.body, r.err, hits.Load(), st)
			}
		})
	}
}

// roundTripResult is what a request sent in the background came to.
type roundTripResult struct {
	body string
	err  error
}

// roundTripAsync sends a request through rt in the background, for at most
// 10s, and delivers its response body or its error.
func roundTripAsync(rt http.RoundTripper, method, url string, body io.Reader) <-chan roundTripResult {
	req, _ := http.NewRequest(method, url, body)
	return sendAsync(rt, req)
}

// sendAsync is roundTripAsync for a request already made: a body of declared
// length without GetBody, say, which net/http's constructor would not make.
func sendAsync(rt http.RoundTripper, req *http.Request) <-chan roundTripResult {
	done := make(chan roundTripResult, 1)
	go func() {
		ctx, cancel := context.WithTimeout(req.Context(), 10*time.Second)
		defer cancel()
		resp, err := rt.RoundTrip(req.WithContext(ctx))
		if err != nil {
			done <- roundTripResult{err: err}
			return
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		done <- roundTripResult{string(b), err}
	}()
	return done
}
