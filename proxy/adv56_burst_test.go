package proxy

import (
	"context"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestAdv56InterimBurstToReadingSiblingFails: the same confusion as
// TestAdv56LargeInterimToReadingSiblingFails, with small heads: each 1xx
// is its own write, hence its own skb on the unix socket, charged at its
// truesize (about 1 KiB for a 100-byte head) against the ~208 KiB send
// buffer. An upstream that sends a quick run of N small 103s fills that
// before a sibling that reads as fast as it can (its hook returns at
// once) has been scheduled, and the owner fails the exchange. x/net/http2
// and the owner's local path deliver every 103 and the 200.
//
// Severity MED (same root cause as the large-head test): a reading sibling
// is taken for a stalled one; how many interim heads a sibling can take
// depends on scheduling, not on the peer.
func TestAdv56InterimBurstToReadingSiblingFails(t *testing.T) {
	up := newRawH2(t, func(s *rawStream) {
		if !strings.HasPrefix(s.path, "/burst/") {
			s.headers(false, ":status", "200", "content-length", "2")
			s.data(true, []byte("ok"))
			return
		}
		n, _ := strconv.Atoi(strings.TrimPrefix(s.path, "/burst/"))
		for range n {
			s.headers(false, ":status", "103", "link", "</style.css>; rel=preload; as=style")
		}
		s.headers(false, ":status", "200", "content-length", "2")
		s.data(true, []byte("ok"))
	})
	owner, client := h2Pair(t, up.url)
	ref := refH2C()
	defer ref.CloseIdleConnections()
	const n = 20000
	for _, name := range h2Paths {
		rt := map[string]http.RoundTripper{"x/net": ref, "owner": owner.tr, "sibling": client.tr}[name]
		var got atomic.Int32
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{Got1xxResponse: func(int, textproto.MIMEHeader) error {
			got.Add(1)
			return nil
		}})
		req, _ := http.NewRequestWithContext(ctx, "GET", up.url+"/burst/"+strconv.Itoa(n), nil)
		o := roundTripOutcome(rt, req)
		cancel()
		if o.err != "" || o.status != 200 || got.Load() != n {
			t.Errorf("%s: %d small 103s in a burst, caller's hook returning at once: status %d body %q error %q, 103s seen %d; want all and the 200",
				name, n, o.status, o.body, o.err, got.Load())
		}
	}
}
