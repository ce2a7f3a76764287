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
	"golang.org/x/net/http2/hpack"
)

// bigHeaders writes a header block on s split into a HEADERS frame and
// CONTINUATION frames of at most 16 KiB (the default SETTINGS_MAX_FRAME_SIZE).
func (s *rawStream) bigHeaders(end bool, pairs ...string) {
	c := s.c
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.hbuf.Reset()
	for i := 0; i+1 < len(pairs); i += 2 {
		c.henc.WriteField(hpack.HeaderField{Name: pairs[i], Value: pairs[i+1]})
	}
	block := c.hbuf.Bytes()
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

// TestAdv56LargeInterimToReadingSiblingFails: relay1xxNoWait writes the
// accept and the whole interim head in ONE non-blocking write, and fails
// the exchange for whatever the unix socket has no room for at that
// instant. Room is a property of the socket (about 208 KiB of skb memory,
// wmem_default), not of the peer: a 103 whose head is larger than that can
// never go out, however fast the sibling reads. The upstream here sends one
// 103 with a 2 MiB Link header (well under every header limit in play:
// x/net's and the Transport's are 10 MiB), then a 200. Through x/net/http2
// and the owner's local path the caller, whose Got1xxResponse hook (Caddy's
// reverse proxy always sets one) returns at once, gets the 103 and the 200.
// Through a sibling that is reading its stream the whole time, the request
// fails: the owner resets the upstream stream and closes the unix stream.
// The same head as a final response (a blocking write) would pass.
//
// Severity MED: a legitimate response, to a legitimate, reading sibling,
// fails only because the connection is shared; the non-blocking write
// confuses "the socket buffer is full right now" with "the peer stopped
// reading". Smaller heads hit the same thing when a burst of 1xx outruns
// the sibling's reader by one socket buffer (see the burst test).
func TestAdv56LargeInterimToReadingSiblingFails(t *testing.T) {
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
