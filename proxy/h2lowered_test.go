package proxy

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestH2LimitLoweredBelowRunningStreams: the upstream lowers its stream
// limit to 1 while three long streams run on its connection, then one of
// them ends. A request sent right after must not wait on that connection,
// which has no room until two more streams end: net/http's client dials a
// new connection, and so must the pool.
func TestH2LimitLoweredBelowRunningStreams(t *testing.T) {
	testH2LimitLoweredRounds(t, testH2LimitLowered)
}

// TestH2LimitLoweredToCallersUnderChurn: four callers run requests one
// after another on one connection whose upstream then lowers its stream
// limit from 100 to 4. Never more than 4 streams are wanted at once, so the
// connection suffices: the pool must not take the lowered limit, read with
// the connection full, for a limit below its streams (3 run here when a
// stream that just ended still counts in the ClientConn) and send the next
// request to dial. net/http's client is no reference here: it dials when a
// caller's next request finds its last stream still counted, which a loaded
// machine makes common (5 connections in one round under -race), where the
// pool waits for that stream to go (settledState).
func TestH2LimitLoweredToCallersUnderChurn(t *testing.T) {
	for round := range 5 {
		testH2LimitLoweredChurn(t, newH2LocalMember(t).tr, round)
	}
}

// testH2LimitLoweredRounds runs five rounds of test through net/http's
// client and through orbit's.
func testH2LimitLoweredRounds(t *testing.T, test func(t *testing.T, rt http.RoundTripper, round int)) {
	for _, tc := range []struct {
		name string
		rt   func(t *testing.T) http.RoundTripper
	}{
		{"net/http", func(t *testing.T) http.RoundTripper {
			var p http.Protocols
			p.SetUnencryptedHTTP2(true)
			tr := &http.Transport{Protocols: &p}
			t.Cleanup(tr.CloseIdleConnections)
			return tr
		}},
		{"orbit", func(t *testing.T) http.RoundTripper { return newH2LocalMember(t).tr }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for round := range 5 {
				test(t, tc.rt(t), round)
			}
		})
	}
}

// newH2LocalMember is a member alone in its pool, speaking h2c, with no
// sweep to read its connections' state between streams.
func newH2LocalMember(t testing.TB) *member {
	return newMemberOpts(t, testSpecLocal, NodeOptions{SweepInterval: time.Hour},
		func(tr *Transport) { tr.H2C = true; tr.MaxConnsPerKey = 4 })
}

func testH2LimitLowered(t *testing.T, rt http.RoundTripper, round int) {
	stop, first := make(chan struct{}), make(chan struct{})
	up := newRawH2(t, func(s *rawStream) {
		if strings.HasPrefix(s.path, "/long") {
			s.headers(false, ":status", "200")
			release := stop
			if s.path == "/long0" {
				release = first
			}
			select {
			case <-release:
			case <-stop:
			}
			s.data(true, []byte("long"))
			return
		}
		s.headers(false, ":status", "200", "content-type", "text/plain")
		s.data(true, []byte("ok"))
	})
	defer close(stop) // before the upstream's cleanup, which waits for the streams
	var long []*http.Response
	defer func() {
		for _, resp := range long {
			resp.Body.Close()
		}
	}()
	for i := range 3 {
		req, _ := http.NewRequest("GET", fmt.Sprintf("%s/long%d", up.url, i), nil)
		resp, err := rt.RoundTrip(req)
		if err != nil {
			t.Fatalf("round %d: long stream: %v", round, err)
		}
		long = append(long, resp)
	}
	if n := up.opens.Load(); n != 3 {
		t.Fatalf("round %d: %d streams opened, want 3", round, n)
	}
	up.waitAcked(t, 1, "the first SETTINGS acknowledged")
	up.setLimit(1)
	up.waitAcked(t, 2, "limit 1 acknowledged")
	// The client has applied the limit before it acknowledged it; let the
	// pool's follower read it, as it would between requests.
	time.Sleep(20 * time.Millisecond)

	close(first)
	if b, err := io.ReadAll(long[0].Body); err != nil || string(b) != "long" {
		t.Fatalf("round %d: the stream that ended: %q, %v", round, b, err)
	}
	for i := range 3 {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		req, _ := http.NewRequestWithContext(ctx, "GET", up.url+"/", nil)
		o := roundTripOutcome(rt, req)
		cancel()
		if o.err != "" || o.body != "ok" {
			t.Fatalf("round %d: request %d after the limit fell below the running streams: %+v", round, i, o)
		}
		if o.duration > time.Second {
			t.Errorf("round %d: request %d took %v", round, i, o.duration)
		}
	}
}

func testH2LimitLoweredChurn(t *testing.T, rt http.RoundTripper, round int) {
	const callers = 4
	up := newRawH2(t, func(s *rawStream) {
		s.headers(false, ":status", "200", "content-type", "text/plain")
		s.data(true, []byte("ok"))
	})
	get := func() string {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", up.url+"/", nil)
		if o := roundTripOutcome(rt, req); o.err != "" || o.body != "ok" {
			return fmt.Sprintf("%s, body %q", o.err, o.body)
		}
		return ""
	}
	if err := get(); err != "" {
		t.Fatalf("round %d: first request: %s", round, err)
	}
	up.waitAcked(t, 1, "the first SETTINGS acknowledged")
	var fails atomic.Int64
	var wg sync.WaitGroup
	deadline := time.Now().Add(600 * time.Millisecond)
	for range callers {
		wg.Go(func() {
			for time.Now().Before(deadline) {
				if err := get(); err != "" {
					fails.Add(1)
				}
			}
		})
	}
	time.Sleep(150 * time.Millisecond)
	up.setLimit(callers)
	wg.Wait()
	if n := fails.Load(); n > 0 {
		t.Errorf("round %d: %d requests failed", round, n)
	}
	up.mu.Lock()
	conns := len(up.conns)
	up.mu.Unlock()
	if conns != 1 {
		t.Errorf("round %d: %d connections dialed for %d callers, the upstream's limit lowered to %d; want 1", round, conns, callers, callers)
	}
}

// alternate sends each request through the next of its transports.
type alternate struct {
	rts []http.RoundTripper
	n   atomic.Int64
}

func (a *alternate) RoundTrip(req *http.Request) (*http.Response, error) {
	return a.rts[int(a.n.Add(1))%len(a.rts)].RoundTrip(req)
}

// TestH2LimitLoweredToCallersSiblings is
// TestH2LimitLoweredToCallersUnderChurn with the callers' requests sent by
// the owner and its sibling in turn: the four streams wanted fit the
// lowered limit of 4 on the owner's connection, and no request may fail or
// dial a second connection.
func TestH2LimitLoweredToCallersSiblings(t *testing.T) {
	for round := range 5 {
		owner, client := remotePair(t, func(tr *Transport) { tr.H2C = true; tr.MaxConnsPerKey = 4 })
		testH2LimitLoweredChurn(t, &alternate{rts: []http.RoundTripper{owner.tr, client.tr}}, round)
		if t.Failed() {
			t.Fatalf("round %d: owner %+v; sibling %+v", round, owner.node.Stats(), client.node.Stats())
		}
	}
}

// TestH2LimitZeroThenRaised: with two long streams running, the
// upstream lowers its limit to 0, then raises it to 3: the pool's capacity
// of the connection follows to 3 without waiting for the sweep, the limit
// last read with room is 3, and a request from the owner and one from a
// sibling run on the connection at once.
func TestH2LimitZeroThenRaised(t *testing.T) {
	stop := make(chan struct{})
	up := newRawH2(t, func(s *rawStream) {
		if strings.HasPrefix(s.path, "/long") {
			s.headers(false, ":status", "200")
			<-stop
			s.data(true, []byte("long"))
			return
		}
		s.headers(false, ":status", "200", "content-type", "text/plain")
		s.data(true, []byte("ok"))
	})
	defer close(stop)
	owner, client := remotePair(t, func(tr *Transport) { tr.H2C = true; tr.MaxConnsPerKey = 1 })
	for range 2 {
		req, _ := http.NewRequest("GET", up.url+"/long", nil)
		resp, err := owner.tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
	}
	id := h2ID(t, owner, up.url)
	hc := owner.node.lookupH2(id)
	up.waitAcked(t, 1, "the first SETTINGS acknowledged")
	up.setLimit(0)
	up.waitAcked(t, 2, "limit 0 acknowledged")
	up.setLimit(3)
	up.waitAcked(t, 3, "limit 3 acknowledged")
	waitFor(t, time.Second, "capacity 3", func() bool { c, _ := owner.pool.Capacity(id); return c == 3 })
	if l := hc.limit.Load(); h2Wrapped && l != 3 { // kept only under the wrapper
		t.Errorf("limit last read with room: %d, want 3", l)
	}
	for _, rt := range []http.RoundTripper{owner.tr, client.tr} {
		req, _ := http.NewRequest("GET", up.url+"/", nil)
		if o := roundTripOutcome(rt, req); o.err != "" || o.body != "ok" || o.duration > 500*time.Millisecond {
			t.Errorf("request after the limit came back: %+v", o)
		}
	}
}
