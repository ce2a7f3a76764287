package proxy

import (
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestAdv25H2LimitZeroThenRaised: with two long streams running, the
// upstream lowers its limit to 0, then raises it to 3: the pool's capacity
// of the connection follows to 3 without waiting for the sweep, the limit
// last read with room is 3, and a request from the owner and one from a
// sibling run on the connection at once.
func TestAdv25H2LimitZeroThenRaised(t *testing.T) {
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
	waitFor(t, 5*time.Second, "the first SETTINGS acknowledged", func() bool { return up.acks.Load() == 1 })
	up.setLimit(0)
	waitFor(t, 5*time.Second, "limit 0 acknowledged", func() bool { return up.acks.Load() == 2 })
	up.setLimit(3)
	waitFor(t, 5*time.Second, "limit 3 acknowledged", func() bool { return up.acks.Load() == 3 })
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
