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

// TestAdv56InterimBurstReachesReadingSibling: the same with small heads.
// Each 1xx is its own write, hence its own skb, charged at its truesize
// (about 1 KiB for a 100-byte head) against the socket's buffer: a quick
// run of small 103s filled it before a sibling reading as fast as it can
// was scheduled, and the first no-wait relay failed the exchange (MED).
// x/net/http2 and the owner's local path deliver every 103 and the 200,
// and so must a sibling.
func TestAdv56InterimBurstReachesReadingSibling(t *testing.T) {
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
