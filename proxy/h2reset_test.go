//go:build go1.27 && !http2legacy

// These tests hold for the pool under x/net's wrapper of net/http's HTTP/2
// client (h2Wrapped), whose full connection the pool reads from the state.
// Under x/net's own client (Go 1.26, or the http2legacy tag), with
// StrictMaxConcurrentStreams, CanTakeNewRequest says yes to a full
// connection and the request waits in the ClientConn for the reset
// stream's PING, as x/net's own client does: reading the state there to
// tell would take the connection's write lock (see syncH2).

package proxy

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestH2LoweredLimitResetUnanswered: a stream reset here before its end
// counts against the connection's limit in the ClientConn until the
// upstream answers the PING sent with the RST_STREAM; this upstream never
// does. It then lowers its limit to 2, with one stream still running: the
// connection has no room, for net/http's client counts the reset stream too,
// and dials. A request from the owner or a sibling must not wait on that
// connection, nor be refused on it until its retries run out: it gets its
// answer at once, as net/http's client does.
func TestH2LoweredLimitResetUnanswered(t *testing.T) {
	testH2ResetUnanswered(t, false)
}

// TestH2KnownLimitResetUnanswered is TestH2LoweredLimitResetUnanswered with
// the limit 2 known before the streams start: read with room to spare, it
// is the peer's limit (h2conn.limit), and a connection merely full at it is
// taken at once (wrappedTakes), for a stream that ended here goes in a
// moment. A stream reset here whose PING goes unanswered does not.
func TestH2KnownLimitResetUnanswered(t *testing.T) {
	testH2ResetUnanswered(t, true)
}

func testH2ResetUnanswered(t *testing.T, known bool) {
	for _, caller := range []string{"net/http", "owner", "sibling"} {
		t.Run(strings.ReplaceAll(caller, "/", "-"), func(t *testing.T) {
			for round := range 3 {
				testH2ResetRound(t, caller, round, known)
			}
		})
	}
}

func testH2ResetRound(t *testing.T, caller string, round int, known bool) {
	up, release := newResetUpstream(t)
	defer release()
	rt, last, owner := h2Callers(t, caller, 4)
	acks := int64(1)
	if known {
		knowLimit(t, rt, up, 2)
		acks++
	}
	req, _ := http.NewRequest("GET", up.url+"/long", nil)
	long, err := rt.RoundTrip(req)
	if err != nil {
		t.Fatalf("round %d: long stream: %v", round, err)
	}
	defer long.Body.Close()
	up.waitAcked(t, acks, "the SETTINGS acknowledged")

	up.stopAnsweringPings()
	// Reset by its deadline with nothing read from the connection since
	// it was sent: the ClientConn counts it until the PING is answered.
	resetHanging(t, rt, up, 100*time.Millisecond)

	if !known {
		up.setLimit(2)
		acks++
		up.waitAcked(t, acks, "limit 2 acknowledged")
		time.Sleep(20 * time.Millisecond) // the follower reads the limit
	}

	answeredAtOnce(t, last, up, owner, fmt.Sprintf("round %d: %s's", round, caller), "a stream reset here")
}

// newResetUpstream is a raw HTTP/2 upstream for the tests of streams the
// ClientConn goes on counting: /hang is never answered, /long sends its
// headers and ends once release is called, and any other path is answered
// "ok". The caller defers release, so that it runs before the cleanups of
// the members it starts after the upstream.
func newResetUpstream(t *testing.T) (up *rawH2, release func()) {
	stop := make(chan struct{})
	up = newRawH2(t, func(s *rawStream) {
		switch {
		case strings.HasPrefix(s.path, "/hang"):
			<-stop
		case strings.HasPrefix(s.path, "/long"):
			s.headers(false, ":status", "200")
			<-stop
			s.data(true, []byte("long"))
		default:
			s.headers(false, ":status", "200", "content-type", "text/plain")
			s.data(true, []byte("ok"))
		}
	})
	return up, func() { close(stop) }
}

// knowLimit sends a first request to up through rt, then has up lower its
// stream limit to limit, and waits for the connection to read it with room
// to spare: it is the peer's limit then (h2conn.limit).
func knowLimit(t *testing.T, rt http.RoundTripper, up *rawH2, limit uint32) {
	t.Helper()
	req, _ := http.NewRequest("GET", up.url+"/", nil)
	if o := roundTripOutcome(rt, req); o.err != "" || o.body != "ok" {
		t.Fatalf("first request: %+v", o)
	}
	up.waitAcked(t, 1, "the first SETTINGS acknowledged")
	up.setLimit(limit)
	up.waitAcked(t, 2, "the lowered limit acknowledged")
	time.Sleep(20 * time.Millisecond) // the follower reads the limit, with room
}

// resetHanging sends a request to up's /hang through rt, which its deadline
// d ends, and waits for the RST_STREAM: the ClientConn read nothing since
// it sent the request, so it counts the stream until up answers the PING
// sent with it.
func resetHanging(t *testing.T, rt http.RoundTripper, up *rawH2, d time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", up.url+"/hang", nil)
	if o := roundTripOutcome(rt, req); o.err == "" {
		t.Fatalf("the request the upstream never answers: %+v", o)
	}
	waitFor(t, 5*time.Second, "the reset stream", func() bool { return up.rsts.Load() == 1 })
}

// readLong starts a stream to url through rt and reads its body in the
// background until the returned func closes it.
func readLong(t *testing.T, rt http.RoundTripper, url string) (closeLong func()) {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	long, err := rt.RoundTrip(req)
	if err != nil {
		t.Fatalf("long stream: %v", err)
	}
	done := make(chan struct{})
	go func() { defer close(done); io.Copy(io.Discard, long.Body) }()
	return func() { long.Body.Close(); <-done }
}

// h2Callers returns, for caller "net/http", "owner" or "sibling", the
// transport that sets a test's streams up (net/http's client, or the
// owner's) and the one whose requests the test checks, and the owner (nil
// for net/http). The owner may dial maxConns connections per key.
func h2Callers(t *testing.T, caller string, maxConns int) (rt, last http.RoundTripper, owner *member) {
	if caller == "net/http" {
		var p http.Protocols
		p.SetUnencryptedHTTP2(true)
		tr := &http.Transport{Protocols: &p}
		t.Cleanup(tr.CloseIdleConnections)
		return tr, tr, nil
	}
	owner, client := remotePair(t, func(tr *Transport) { tr.H2C = true; tr.MaxConnsPerKey = maxConns })
	if caller == "sibling" {
		return owner.tr, client.tr, owner
	}
	return owner.tr, owner.tr, owner
}

// answeredAtOnce sends three GETs to up through rt, each of which must be
// answered "ok" within 500 ms, with the connection full with what (a
// stream the ClientConn counts and the pool does not). who names the
// caller in failures; owner, if any, has its counters logged with them.
func answeredAtOnce(t *testing.T, rt http.RoundTripper, up *rawH2, owner *member, who, what string) {
	t.Helper()
	for i := range 3 {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		req, _ := http.NewRequestWithContext(ctx, "GET", up.url+"/", nil)
		o := roundTripOutcome(rt, req)
		cancel()
		if o.err != "" || o.body != "ok" {
			t.Errorf("%s request %d, the connection full with %s: %+v", who, i, what, o)
		} else if o.duration > 500*time.Millisecond {
			t.Errorf("%s request %d took %v", who, i, o.duration)
		}
	}
	if owner != nil && t.Failed() {
		t.Logf("%s: %d streams opened upstream, %d connections, owner %+v", who, up.opens.Load(), up.nconns(), owner.node.Stats())
	}
}

func (u *rawH2) nconns() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.conns)
}
