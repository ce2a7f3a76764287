package proxy

import (
	"fmt"
	"testing"
)

// TestAdv43PaddedTrailersWithinReaderLikeNetHTTP: an HTTP/2 upstream ends
// a response with 200 short trailer fields whose values begin with a space
// (" v"), 2.4 KB of trailers as HTTP/1.1 text. net/http's HTTP/2 client
// (x/net/http2) takes them (its bound is the header list limit, 10 MiB by
// default) and gives each value as sent; so does the owner's own exchange.
// Through a sibling, the relay now wraps every such field in Orbit-Padded
// ("Orbit-Padded: X-T-000 | v|", 28 bytes a field instead of 12), and the
// sibling's net/http chunked reader takes trailers only up to its bufio
// buffer (readBufSize, 4 KiB: "suspiciously long trailer after chunked
// body"): the caller's body read fails where net/http's succeeds. Before
// the wrap the same trailers crossed (trimmed); the encoding more than
// doubles short padded trailers and pushes them over the reader's bound.
func TestAdv43PaddedTrailersWithinReaderLikeNetHTTP(t *testing.T) {
	const n = 200
	var tr []string
	for i := range n {
		tr = append(tr, fmt.Sprintf("x-t-%03d", i), " v")
	}
	outs, client := rawH2Outcomes(t, "GET", "/trailers", func(s *rawStream) {
		s.headers(false, ":status", "200")
		s.data(false, []byte("ok"))
		s.headers(true, tr...)
	})
	for _, name := range h2Paths {
		o := outs[name]
		if o.err != "" || o.status != 200 || o.body != "ok" {
			t.Errorf("%s: err %q status %d body %q; want 200 \"ok\" with its trailers, as net/http", name, o.err, o.status, o.body)
			continue
		}
		if len(o.trailer) != n {
			t.Errorf("%s: %d trailer fields; want %d as sent", name, len(o.trailer), n)
		}
		if got := o.trailer.Values("X-T-199"); len(got) != 1 || got[0] != " v" {
			t.Errorf("%s: trailer X-T-199 %q; want [\" v\"] as sent", name, got)
		}
	}
	if st := client.node.Stats(); st.ReusedRemote == 0 {
		t.Errorf("the sibling's request did not go through the owner (%+v)", st)
	}
}
