package proxy

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestH2LimitLoweredBelowRunningStreams: the upstream lowers its stream
// limit to 1 while three long streams run on its connection, then one of
// them ends. A request sent right after must not wait on that connection,
// which has no room until two more streams end: net/http's client dials a
// new connection, and so must the pool.
func TestH2LimitLoweredBelowRunningStreams(t *testing.T) {
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
		{"orbit", func(t *testing.T) http.RoundTripper {
			return newMember(t, testSpecLocal, func(tr *Transport) { tr.H2C = true; tr.MaxConnsPerKey = 4 }).tr
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for round := range 5 {
				testH2LimitLowered(t, tc.rt(t), round)
			}
		})
	}
}

func testH2LimitLowered(t *testing.T, rt http.RoundTripper, round int) {
	stop := make(chan struct{})
	finish := make(chan struct{}, 3)
	up := newRawH2(t, func(s *rawStream) {
		if strings.HasPrefix(s.path, "/long") {
			s.headers(false, ":status", "200")
			select {
			case <-finish:
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
	for range 3 {
		req, _ := http.NewRequest("GET", up.url+"/long", nil)
		resp, err := rt.RoundTrip(req)
		if err != nil {
			t.Fatalf("round %d: long stream: %v", round, err)
		}
		long = append(long, resp)
	}
	if n := up.opens.Load(); n != 3 {
		t.Fatalf("round %d: %d streams opened, want 3", round, n)
	}
	waitFor(t, 5*time.Second, "the first SETTINGS acknowledged", func() bool { return up.acks.Load() == 1 })
	up.setLimit(1)
	waitFor(t, 5*time.Second, "limit 1 acknowledged", func() bool { return up.acks.Load() == 2 })
	// The client has applied the limit before it acknowledged it; let the
	// pool's follower read it, as it would between requests.
	time.Sleep(20 * time.Millisecond)

	finish <- struct{}{}
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
