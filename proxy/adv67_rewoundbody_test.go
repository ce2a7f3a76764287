package proxy

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// adv67Body is a request body that records whether it was closed.
type adv67Body struct {
	io.Reader
	closed atomic.Bool
}

func (b *adv67Body) Close() error { b.closed.Store(true); return nil }

// adv67Bodies hands out bodies of n bytes, the first as the request's Body,
// the others from GetBody, and remembers them all.
type adv67Bodies struct {
	mu  sync.Mutex
	all []*adv67Body
	n   int
}

func (s *adv67Bodies) next() *adv67Body {
	s.mu.Lock()
	defer s.mu.Unlock()
	b := &adv67Body{Reader: io.LimitReader(strings.NewReader(strings.Repeat("x", s.n)), int64(s.n))}
	s.all = append(s.all, b)
	return b
}

func (s *adv67Bodies) unclosed() (open, total int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, b := range s.all {
		if !b.closed.Load() {
			open++
		}
	}
	return open, len(s.all)
}

// post is a POST of one of s's bodies to url, whose GetBody hands out the
// next.
func (s *adv67Bodies) post(ctx context.Context, url string) *http.Request {
	req, _ := http.NewRequestWithContext(ctx, "POST", url, s.next())
	req.ContentLength = int64(s.n)
	req.GetBody = func() (io.ReadCloser, error) { return s.next(), nil }
	return req
}

// requireClosed fails the test unless every body handed out, at least min
// of them, is closed within a second of RoundTrip's return with err.
func (s *adv67Bodies) requireClosed(t *testing.T, min int, err error) {
	t.Helper()
	var open, total int
	for deadline := time.Now().Add(time.Second); ; time.Sleep(10 * time.Millisecond) {
		if open, total = s.unclosed(); open == 0 || time.Now().After(deadline) {
			break
		}
	}
	if total < min {
		t.Fatalf("setup: %d bodies handed out, want at least %d (GetBody not called?), err %v", total, min, err)
	}
	if open != 0 {
		t.Errorf("%d of the %d request bodies (the original and GetBody's) were never closed after RoundTrip returned %v", open, total, err)
	}
}

// adv67ClosingUpstream answers the first request on each connection, and
// reads the second one's body whole before it closes the connection
// unanswered: a reused connection that closed before answering, after
// which a replayable request is sent again with a body from GetBody.
func adv67ClosingUpstream(t *testing.T) string {
	var mu sync.Mutex
	answered := map[net.Conn]bool{}
	return rawUpstream(t, func(c net.Conn, _ *bufio.Reader, req *http.Request) bool {
		io.Copy(io.Discard, req.Body)
		mu.Lock()
		defer mu.Unlock()
		if answered[c] {
			c.Close()
			return false
		}
		answered[c] = true
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		return true
	}) + "/"
}

// TestAdv67EndedWaitClosesTheRewoundBody: RoundTrip must close every
// request body it was given or made, on errors too (net/http's contract,
// and net/http closes the body it rewound for a retry it does not send).
// A replayable POST with GetBody whose streamed body was sent on a reused
// connection that closed unanswered is rewound (GetBody); the watcher is
// told of the retry and ends the context (as the Caddy module's wait guard
// does when a refusal spent the wait, or as a client going away at that
// instant does). The loop stops and must close the rewound body for real
// (dropRetry): a trackBody that was never read only marks a Close pending
// (closeFor), and nothing would settle it.
func TestAdv67EndedWaitClosesTheRewoundBody(t *testing.T) {
	url := adv67ClosingUpstream(t)
	m := localTransportMember(t, nil)
	warm(t, m, url)
	bodies := &adv67Bodies{n: 16 << 10} // past maxBodyWithHead: streamed, not read ahead
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	w := &recordWaits{retry: cancel}
	req := bodies.post(WithWaitWatcher(ctx, w), url)
	req.Header.Set("Idempotency-Key", "adv67")
	resp, err := m.tr.RoundTrip(req)
	if err == nil {
		drain(resp)
		t.Fatalf("served after the watcher ended the wait (watcher told %q)", w.got())
	}
	if got := w.got(); got != "wrote retry" {
		t.Fatalf("setup: watcher told %q, want \"wrote retry\" (err %v)", got, err)
	}
	bodies.requireClosed(t, 2, err)
}

// adv67RefusalEndsWait is a WaitWatcher that ends the request's context
// when it is told of a retry after a refusal, as the Caddy module's wait
// guard does once the refusal has spent the wait timeout.
type adv67RefusalEndsWait struct {
	recordWaits
	cancel func()
}

func (w *adv67RefusalEndsWait) Retrying(refused bool) {
	w.recordWaits.Retrying(refused)
	if refused {
		w.cancel()
	}
}

// TestAdv67RefusedH2StreamClosesTheRewoundBody is the same on the path
// where the Caddy module's wait guard ends the wait: a POST sent whole on an h2c connection
// whose upstream then leaves the stream out of a GOAWAY (a stream refused
// as its connection went away: refusedUnserved), its body read, so that
// the retry's body comes from GetBody; the watcher ends the wait as it is
// told of the refusal. The GetBody body must be closed.
func TestAdv67RefusedH2StreamClosesTheRewoundBody(t *testing.T) {
	var first atomic.Bool
	up := newRawH2(t, func(s *rawStream) {
		if s.path == "/post" && first.CompareAndSwap(false, true) {
			s.goAway(s.id - 2)
			return
		}
		s.headers(false, ":status", "200", "content-length", "2")
		s.data(true, []byte("ok"))
	})
	m := localTransportMember(t, h2cConf)
	if err := getOK(m, context.Background(), up.url+"/"); err != nil {
		t.Fatal(err)
	}
	bodies := &adv67Bodies{n: 16 << 10}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	w := &adv67RefusalEndsWait{cancel: cancel}
	req := bodies.post(WithWaitWatcher(ctx, w), up.url+"/post")
	resp, err := m.tr.RoundTrip(req)
	if err == nil {
		drain(resp)
		t.Fatalf("setup: served (watcher told %q)", w.got())
	}
	if got := w.got(); got != "wrote retry-refused" {
		t.Fatalf("setup: watcher told %q, want \"wrote retry-refused\" (err %v)", got, err)
	}
	bodies.requireClosed(t, 2, err)
}

// TestAdv67AwayBackoffClosesTheRewoundBody: the other retry not sent: a
// POST whose h2c upstream keeps leaving its stream out of a
// GOAWAY is rewound (GetBody) for each retry; once its free retries are
// spent, awayBackoff declines a wait that would reach the deadline, and
// the loop must close the rewound body for real. No watcher is needed.
func TestAdv67AwayBackoffClosesTheRewoundBody(t *testing.T) {
	up := newRawH2(t, func(s *rawStream) {
		if s.path == "/post" {
			var last uint32 // every stream of the connection before this one
			if s.id > 2 {
				last = s.id - 2
			}
			s.goAway(last)
			return
		}
		s.headers(false, ":status", "200", "content-length", "2")
		s.data(true, []byte("ok"))
	})
	m := localTransportMember(t, h2cConf)
	if err := getOK(m, context.Background(), up.url+"/"); err != nil {
		t.Fatal(err)
	}
	bodies := &adv67Bodies{n: 16 << 10}
	ctx, cancel := context.WithTimeout(context.Background(), 400*time.Millisecond)
	defer cancel()
	req := bodies.post(ctx, up.url+"/post")
	resp, err := m.tr.RoundTrip(req)
	if err == nil {
		drain(resp)
		t.Fatal("setup: served")
	}
	t.Logf("err %v after %d bodies", err, len(bodies.all))
	bodies.requireClosed(t, 2, err)
}
