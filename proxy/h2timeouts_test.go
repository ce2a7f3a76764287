package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"runtime/debug"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestH2ResponseHeaderTimeout: ResponseHeaderTimeout bounds the wait for an
// HTTP/2 response head as it bounds an HTTP/1.1 one, and as net/http's own
// HTTP/2 client applies its transport's: on the owner's stream and on a
// sibling's through it, an upstream that never answers fails the request
// with ErrResponseHeaderTimeout long before its context ends, and the
// stream's unit comes back.
func TestH2ResponseHeaderTimeout(t *testing.T) {
	up := newRawH2(t, func(s *rawStream) {
		if s.path == "/" {
			s.headers(false, ":status", "200", "content-length", "2")
			s.data(true, []byte("ok"))
		}
		// Anything else is never answered.
	})
	owner, client := remotePair(t, func(tr *Transport) { h2cConf(tr); tr.ResponseHeaderTimeout = 100 * time.Millisecond })
	if err := getOK(owner, context.Background(), up.url+"/"); err != nil {
		t.Fatal(err)
	}
	for _, m := range []*member{owner, client} {
		name := map[bool]string{true: "owner", false: "sibling"}[m == owner]
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		req, _ := http.NewRequestWithContext(ctx, "GET", up.url+"/silent", nil)
		start := time.Now()
		resp, err := m.tr.RoundTrip(req)
		took := time.Since(start)
		cancel()
		if err == nil {
			resp.Body.Close()
			t.Fatalf("%s: an upstream that never answered gave status %d", name, resp.StatusCode)
		}
		if !errors.Is(err, ErrResponseHeaderTimeout) || took > 5*time.Second {
			t.Errorf("%s: %v after %v; want ErrResponseHeaderTimeout after about 100ms", name, err, took)
		}
	}
	capacityBack(t, owner, up.url)
}

// TestH2ExpectContinueTimeout: a request that asks to wait for a 100
// (Expect: 100-continue) to an HTTP/2 upstream sends its body on the 100, or
// once ExpectContinueTimeout has passed without one, and never when the
// upstream refuses it first (417), as net/http's own HTTP/2 client does with
// its transport's timeout: on the owner's stream and on a sibling's through
// it. A refused body is not read at all, so a server in front never tells
// its client to send it.
func TestH2ExpectContinueTimeout(t *testing.T) {
	const ect = time.Second
	var mu sync.Mutex
	waited := map[string]time.Duration{} // path: from the request's head to its body's first bytes
	up := newRawH2(t, func(s *rawStream) {
		if s.path == "/" {
			s.headers(false, ":status", "200", "content-length", "2")
			s.data(true, []byte("ok"))
			return
		}
		if strings.Contains(s.path, "/refuse/") {
			s.headers(true, ":status", "417")
			return
		}
		start := time.Now()
		if strings.Contains(s.path, "/continue/") {
			s.headers(false, ":status", "100")
		}
		n := 0
		for p := range s.received {
			if n == 0 {
				mu.Lock()
				waited[s.path] = time.Since(start)
				mu.Unlock()
			}
			n += len(p)
		}
		s.headers(false, ":status", "200", "content-length", "2")
		s.data(true, []byte("ok"))
	})
	owner, client := remotePair(t, func(tr *Transport) { h2cConf(tr); tr.ExpectContinueTimeout = ect })
	if err := getOK(owner, context.Background(), up.url+"/"); err != nil {
		t.Fatal(err)
	}
	ref := stockH2C(t, ect)
	for _, p := range []struct {
		name string
		rt   http.RoundTripper
		m    *member // the member whose connection it used, if orbit's
	}{{"net/http", ref, nil}, {"owner", owner.tr, owner}, {"sibling", client.tr, client}} {
		path := p.name
		for _, answer := range []string{"continue", "silent", "refuse"} {
			url := up.url + "/early/" + answer + "/" + strings.ReplaceAll(path, "/", "-")
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			body := newStackedBody("hello")
			req, _ := http.NewRequestWithContext(ctx, "POST", url, body)
			req.ContentLength = 5
			req.Header.Set("Expect", "100-continue")
			o := roundTripOutcome(p.rt, req)
			cancel()
			mu.Lock()
			w, sent := waited[strings.TrimPrefix(url, up.url)]
			mu.Unlock()
			switch {
			case answer == "refuse":
				if by := body.readBy(5 * time.Second); o.err != "" || o.status != 417 || sent || by != "" {
					t.Errorf("%s, refused: %+v; want 417 and the body never read; read by\n%s", path, o, by)
				}
			case o.err != "" || o.status != 200 || !sent:
				t.Errorf("%s, %s: %+v, body received %v; want it answered 200", path, answer, o, sent)
			case answer == "continue" && w >= ect/2:
				t.Errorf("%s: the body came %v after the head, though the 100 came at once", path, w)
			case answer == "silent" && w < ect*2/3:
				t.Errorf("%s: the body came %v after the head; want it held for the %v the request waits for a 100", path, w, ect)
			}
		}
		// The connection and the unix leg are in step for the next request.
		if p.m != nil {
			if err := getOK(p.m, context.Background(), up.url+"/"); err != nil {
				t.Errorf("%s: the request after: %v", path, err)
			}
		}
	}
}

// stackedBody is a request body that keeps the stack of its first Read, of
// any length (a net/http server's body tells its client to continue on
// that), and tells when it is closed: a transport closes a request body
// once its writer is done with it, which may be after RoundTrip returned.
type stackedBody struct {
	r      io.Reader
	mu     sync.Mutex
	stack  string
	once   sync.Once
	closed chan struct{}
}

func newStackedBody(s string) *stackedBody {
	return &stackedBody{r: strings.NewReader(s), closed: make(chan struct{})}
}

func (b *stackedBody) Read(p []byte) (int, error) {
	b.mu.Lock()
	if b.stack == "" {
		b.stack = string(debug.Stack())
	}
	b.mu.Unlock()
	return b.r.Read(p)
}

func (b *stackedBody) Close() error {
	b.once.Do(func() { close(b.closed) })
	return nil
}

// readBy waits up to d for the body to be closed, and returns the stack of
// its first Read, "" if it had none, or why it cannot tell.
func (b *stackedBody) readBy(d time.Duration) string {
	select {
	case <-b.closed:
	case <-time.After(d):
		return fmt.Sprintf("(the body was not closed within %v)", d)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.stack
}
