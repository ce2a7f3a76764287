package proxy

import (
	"context"
	"errors"
	"net/http"
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
// (Expect: 100-continue) to an HTTP/2 upstream sends its body on the 100,
// or once ExpectContinueTimeout has passed without one, as net/http's own
// HTTP/2 client does with its transport's, on the owner's stream and on a
// sibling's through it.
func TestH2ExpectContinueTimeout(t *testing.T) {
	const ect = 300 * time.Millisecond
	var mu sync.Mutex
	waited := map[string]time.Duration{} // path: from the request's head to its body's first bytes
	up := newRawH2(t, func(s *rawStream) {
		if s.path == "/" {
			s.headers(false, ":status", "200", "content-length", "2")
			s.data(true, []byte("ok"))
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
	for _, m := range []*member{owner, client} {
		for _, answer := range []string{"continue", "silent"} {
			path := "/early/" + answer + "/" + map[bool]string{true: "owner", false: "sibling"}[m == owner]
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			req, _ := http.NewRequestWithContext(ctx, "POST", up.url+path, strings.NewReader("hello"))
			req.Header.Set("Expect", "100-continue")
			o := roundTripOutcome(m.tr, req)
			cancel()
			mu.Lock()
			w, ok := waited[path]
			mu.Unlock()
			switch {
			case o.err != "" || o.status != 200 || !ok:
				t.Errorf("%s: %+v, body received %v; want it answered 200", path, o, ok)
			case answer == "continue" && w >= 10*ect:
				t.Errorf("%s: the body came %v after the head, though the 100 came at once", path, w)
			case answer == "silent" && w < ect*2/3:
				t.Errorf("%s: the body came %v after the head; want it held for the %v the request waits for a 100", path, w, ect)
			}
		}
	}
}
