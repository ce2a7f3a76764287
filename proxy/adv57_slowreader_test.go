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

// TestAdv57SlowSteadyInterimReaderFails: a sibling whose caller reads
// every interim response, steadily, a little slower than the upstream
// sends them (its Got1xxResponse hook takes 20 ms, as Caddy's does when it
// forwards each 1xx to a slow client), fails through the owner where the
// same caller succeeds on x/net/http2 and on the owner's local path. The
// upstream sends 30 103s of ~60 KiB (each well under the 256 KiB header
// limit), then a 200. x/net and the local path deliver all 30 and the 200
// (the hook holds the read loop, and the upstream waits on TCP). Through
// the sibling the owner's queue (relay1xxNoWait, bounded by the header
// limit however steadily the sibling reads) overflows as soon as the
// upstream is more than one socket buffer plus the limit ahead, and the
// exchange fails with "sibling not reading its interim responses": the
// relay cannot tell a slow reader from a stalled one, because the bound is
// on bytes queued, not on progress.
//
// Severity LOW: the upstream's interim heads total several times the
// header limit, which a reasonable upstream does not send, and the queue
// must be bounded somehow; but it is the adv56 class again (a reading
// sibling taken for a stalled one, only because the connection is shared),
// and the outcome differs from net/http's HTTP/1.1 relay, which waits for
// the sibling.
func TestAdv57SlowSteadyInterimReaderFails(t *testing.T) {
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
	owner, client := remotePair(t, func(tr *Transport) { h2cConf(tr); tr.MaxResponseHeaderBytes = limit })
	if err := getOK(owner, context.Background(), up.url+"/"); err != nil {
		t.Fatal(err)
	}
	ref := refH2C()
	ref.MaxHeaderListSize = limit
	defer ref.CloseIdleConnections()
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
