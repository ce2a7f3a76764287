package proxy

import (
	"context"
	"net/http"
	"testing"
	"time"
)

// TestAdv5H2PeerLimitZero: an upstream that lowers
// SETTINGS_MAX_CONCURRENT_STREAMS to 0 on its connection (it takes no new
// stream there for now) leaves that connection no room: with budget for
// another connection, a request from the owner or a sibling dials one, as
// net/http's HTTP/2 transport does, rather than wait on the first
// connection until its deadline.
func TestAdv5H2PeerLimitZero(t *testing.T) {
	up := newRawH2(t, func(s *rawStream) {
		s.headers(false, ":status", "200", "content-type", "text/plain")
		s.data(true, []byte("ok"))
	})
	owner, client := remotePair(t, func(tr *Transport) { tr.H2C = true; tr.MaxConnsPerKey = 3 })
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	ref := &http.Transport{Protocols: &p}
	defer ref.CloseIdleConnections()
	for _, rt := range []http.RoundTripper{ref, owner.tr} {
		req, _ := http.NewRequest("GET", up.url+"/", nil)
		if o := roundTripOutcome(rt, req); o.err != "" || o.body != "ok" {
			t.Fatalf("first request: %+v", o)
		}
	}
	id := h2ID(t, owner, up.url)
	// Each client's acknowledgment of the upstream's first SETTINGS may
	// still be on its way: counted after this point, it would pass for an
	// acknowledgment of limit 0.
	up.waitAcked(t, 1, "both clients to acknowledge the first SETTINGS")
	up.setLimit(0)
	up.waitAcked(t, 2, "both clients to acknowledge limit 0")
	// The follower reads the new limit once the client has applied it.
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if c, _ := owner.pool.Capacity(id); c == 0 {
			break
		}
	}
	for _, rt := range []struct {
		name string
		rt   http.RoundTripper
	}{{"net/http", ref}, {"owner", owner.tr}, {"sibling", client.tr}} {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		req, _ := http.NewRequestWithContext(ctx, "GET", up.url+"/", nil)
		o := roundTripOutcome(rt.rt, req)
		cancel()
		if o.err != "" || o.status != 200 || o.body != "ok" {
			t.Errorf("%s, with the first connection at limit 0: %+v", rt.name, o)
		}
	}
	if c, _ := owner.pool.Capacity(id); c != 0 {
		t.Errorf("the pool's capacity of the connection at limit 0 is %d, want 0", c)
	}
	if n := up.opens.Load(); n != 5 {
		t.Errorf("the upstream saw %d streams, want 5", n)
	}
}
