package proxy

import (
	"context"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestAdv57SlowSteadyInterimReaderGetsEveryHead: a sibling whose caller
// reads every interim response, steadily, a little slower than the
// upstream sends them (its Got1xxResponse hook takes 20 ms, as Caddy's does
// when it forwards each 1xx to a slow client), gets them all and the final
// response, as on x/net/http2 and the owner's local path (where the hook
// holds the read loop, and the upstream waits on TCP). The upstream sends
// 30 103s of ~60 KiB, each under the 256 KiB header limit, then a 200.
// With the queue bounded on bytes alone, the relay took the slow reader for
// a stalled one and failed the exchange once the upstream was the limit
// ahead (LOW): now a full queue waits for the sibling's progress.
func TestAdv57SlowSteadyInterimReaderGetsEveryHead(t *testing.T) {
	const limit = 256 << 10
	const n = 30
	link := "<" + strings.Repeat("a", 60<<10) + ">; rel=preload"
	up := newRawH2(t, func(s *rawStream) {
		if s.path != "/slow" {
			s.headers(false, ":status", "200", "content-length", "2")
			s.data(true, []byte("ok"))
			return
		}
		for range n {
			s.bigHeaders(false, ":status", "103", "link", link)
		}
		s.headers(false, ":status", "200", "content-length", "2")
		s.data(true, []byte("ok"))
	})
	owner, client, ref := limitedH2Pair(t, up.url, limit)
	for _, name := range h2Paths {
		rt := map[string]http.RoundTripper{"x/net": ref, "owner": owner.tr, "sibling": client.tr}[name]
		var got atomic.Int32
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{Got1xxResponse: func(code int, h textproto.MIMEHeader) error {
			if code == 103 && h.Get("Link") == link {
				got.Add(1)
			}
			time.Sleep(20 * time.Millisecond)
			return nil
		}})
		req, _ := http.NewRequestWithContext(ctx, "GET", up.url+"/slow", nil)
		o := roundTripOutcome(rt, req)
		cancel()
		if o.err != "" || o.status != 200 || o.body != "ok" || got.Load() != n {
			t.Errorf("%s: %d 103s of %d KiB (limit %d KiB), caller's hook taking 20 ms each: status %d body %q error %q, 103s seen %d; want all %d and the 200",
				name, n, len(link)>>10, limit>>10, o.status, o.body, o.err, got.Load(), n)
		}
	}
	if s := client.node.Stats(); s.ReusedRemote == 0 {
		t.Errorf("the sibling's request did not go through the owner: %+v", s)
	}
}
