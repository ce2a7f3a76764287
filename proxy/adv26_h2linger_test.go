//go:build go1.27 && !http2legacy

// Streams the ClientConn counts against the peer's limit after the pool has
// given their unit back, other than one reset on its request's context:
// unless they mark the connection (h2conn.lingering), wrappedTakes takes a
// connection "merely full at its known limit" at once, and the request
// waits in the ClientConn for a running stream to end, where net/http's
// client dials.

package proxy

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// errBodyBroken is a request body that fails before giving a byte.
type errBodyBroken struct{}

func (errBodyBroken) Read([]byte) (int, error) { return 0, errors.New("request body broken") }
func (errBodyBroken) Close() error             { return nil }

// TestAdv26BodyErrorResetUnanswered: the upstream's limit is 2, known with
// room to spare; one long stream runs. The upstream stops answering PINGs,
// and a POST whose request body fails at once is reset (RST_STREAM with a
// PING, nothing read since it was sent): the ClientConn counts it until the
// PING is answered, but its request's context did not end, so hc.lingering was
// not set. A GET then must be answered at once, as net/http's client (which
// dials) answers it.
func TestAdv26BodyErrorResetUnanswered(t *testing.T) {
	testAdv26Linger(t, []string{"net/http", "owner", "sibling"}, func(t *testing.T, rt http.RoundTripper, up *rawH2) func() {
		req, _ := http.NewRequest("POST", up.url+"/post", errBodyBroken{})
		req.ContentLength = -1
		resp, err := rt.RoundTrip(req)
		if err == nil {
			resp.Body.Close()
			t.Fatalf("POST with a broken body: %d", resp.StatusCode)
		}
		waitFor(t, 5*time.Second, "the reset stream", func() bool { return up.rsts.Load() == 1 })
		return func() {}
	})
}

// TestAdv26ZeroLengthLingering: limit 2, known; one long stream runs. A
// GET is answered with HEADERS (content-length: 0) without END_STREAM, the
// END_STREAM held back (a handler that flushed its headers and goes on
// working); the caller reads the body, which ends only with END_STREAM. The
// pool gives the unit back when RoundTrip returns (ContentLength 0), but the
// ClientConn counts the stream until END_STREAM. A GET then must be
// answered at once, as net/http's client (which dials) answers it.
func TestAdv26ZeroLengthLingering(t *testing.T) {
	testAdv26Linger(t, []string{"net/http", "owner", "sibling"}, func(t *testing.T, rt http.RoundTripper, up *rawH2) func() {
		req, _ := http.NewRequest("GET", up.url+"/zero", nil)
		resp, err := rt.RoundTrip(req)
		if err != nil {
			t.Fatalf("zero-length GET: %v", err)
		}
		if resp.StatusCode != 200 || resp.ContentLength != 0 {
			resp.Body.Close()
			t.Fatalf("zero-length GET: %d, length %d", resp.StatusCode, resp.ContentLength)
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			io.Copy(io.Discard, resp.Body)
		}()
		return func() {
			resp.Body.Close()
			<-done
		}
	})
}

// testAdv26Linger runs, for each caller, an upstream with limit 2 (known),
// one long stream, then linger, then three GETs that must each be answered
// within 500ms.
func testAdv26Linger(t *testing.T, callers []string, linger func(t *testing.T, rt http.RoundTripper, up *rawH2) func()) {
	for _, caller := range callers {
		t.Run(strings.ReplaceAll(caller, "/", "-"), func(t *testing.T) {
			for round := range 2 {
				testAdv26LingerRound(t, caller, round, linger)
			}
		})
	}
}

func testAdv26LingerRound(t *testing.T, caller string, round int, linger func(t *testing.T, rt http.RoundTripper, up *rawH2) func()) {
	stop := make(chan struct{})
	up := newRawH2(t, func(s *rawStream) {
		switch {
		case strings.HasPrefix(s.path, "/long"):
			s.headers(false, ":status", "200")
			<-stop
			s.data(true, []byte("long"))
		case strings.HasPrefix(s.path, "/zero"):
			s.headers(false, ":status", "200", "content-length", "0")
			<-stop
			s.data(true, nil)
		default:
			s.headers(false, ":status", "200", "content-type", "text/plain")
			s.data(true, []byte("ok"))
		}
	})
	defer close(stop)
	rt, last, owner := h2Callers(t, caller, 4)
	knowLimit(t, rt, up, 2)

	req, _ := http.NewRequest("GET", up.url+"/long", nil)
	long, err := rt.RoundTrip(req)
	if err != nil {
		t.Fatalf("round %d: long stream: %v", round, err)
	}
	defer long.Body.Close()
	up.stopAnsweringPings()
	defer linger(t, rt, up)()
	time.Sleep(20 * time.Millisecond) // the follower reads the state

	answeredAtOnce(t, last, up, owner, fmt.Sprintf("round %d: %s's", round, caller), "a stream the pool no longer counts")
}
