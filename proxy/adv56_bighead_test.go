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

	"golang.org/x/net/http2"
)

// bigHeaders writes a header block on s split into a HEADERS frame and
// CONTINUATION frames of at most 16 KiB (the default SETTINGS_MAX_FRAME_SIZE).
func (s *rawStream) bigHeaders(end bool, pairs ...string) {
	c := s.c
	c.wmu.Lock()
	defer c.wmu.Unlock()
	block := c.encode(pairs)
	const max = 16 << 10
	first := block
	if len(first) > max {
		first = first[:max]
	}
	block = block[len(first):]
	c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: s.id, BlockFragment: first, EndHeaders: len(block) == 0, EndStream: end})
	for len(block) > 0 {
		n := min(len(block), max)
		c.fr.WriteContinuation(s.id, n == len(block), block[:n])
		block = block[n:]
	}
}

// TestAdv56LargeInterimReachesReadingSibling: a 103 whose head is larger
// than the unix socket's buffer (about 208 KiB, wmem_default), one 2 MiB
// Link header well under every header limit in play, then a 200: through a
// sibling that reads its stream the whole time, the caller (whose
// Got1xxResponse hook returns at once, as Caddy's does) gets both, as
// through x/net/http2 and the owner's local path. The first no-wait relay
// wrote each head in one non-blocking write and failed the exchange for
// what the socket had no room for: it took a full socket buffer for a
// stalled peer (MED).
func TestAdv56LargeInterimReachesReadingSibling(t *testing.T) {
	link := "<" + strings.Repeat("a", 2<<20) + ">; rel=preload"
	up := newRawH2(t, func(s *rawStream) {
		if s.path != "/big" {
			s.headers(false, ":status", "200", "content-length", "2")
			s.data(true, []byte("ok"))
			return
		}
		s.bigHeaders(false, ":status", "103", "link", link)
		s.headers(false, ":status", "200", "content-length", "2")
		s.data(true, []byte("ok"))
	})
	owner, client := h2Pair(t, up.url)
	ref := refH2C()
	defer ref.CloseIdleConnections()
	for _, name := range h2Paths {
		rt := map[string]http.RoundTripper{"x/net": ref, "owner": owner.tr, "sibling": client.tr}[name]
		var got atomic.Int32
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{Got1xxResponse: func(code int, h textproto.MIMEHeader) error {
			if code == 103 && len(h.Get("Link")) == len(link) {
				got.Add(1)
			}
			return nil
		}})
		req, _ := http.NewRequestWithContext(ctx, "GET", up.url+"/big", nil)
		o := roundTripOutcome(rt, req)
		cancel()
		if o.err != "" || o.status != 200 || o.body != "ok" || got.Load() != 1 {
			t.Errorf("%s: one 103 with a %d KiB Link header (under every limit), caller's hook returning at once: status %d body %q error %q, 103s seen %d; want the 103 and the 200",
				name, len(link)>>10, o.status, o.body, o.err, got.Load())
		}
	}
	if s := client.node.Stats(); s.ReusedRemote == 0 {
		t.Errorf("the sibling's request did not go through the owner: %+v", s)
	}
}
