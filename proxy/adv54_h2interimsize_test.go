package proxy

import (
	"strconv"
	"strings"
	"testing"
)

// TestAdv54H2InterimSizeCountsWireFields: relay1xx (406583b) bounds the
// interim heads of a caller without a hook by summing the HPACK sizes of
// the header map it is handed, but x/net/http2 sums those of the HEADERS
// frame's fields (f.Fields), and the map it hands a Got1xxResponse hook is
// not all of them: a "trailer" field is taken out of it (into
// res.Trailer), and :status is counted as sent, not as three digits
// (strconv.Atoi takes "0103" and "+103"). Same upstream bytes, under a
// 64 KiB limit: x/net and the owner-local path refuse 40 interim heads of
// 1.6 KiB each, the sibling's owner passed them on and returned the 200.
// The owner now gives such a caller's exchange no Got1xxResponse hook, so
// that the HTTP/2 client bounds them itself.
func TestAdv54H2InterimSizeCountsWireFields(t *testing.T) {
	const limit = 64 << 10
	up := newRawH2(t, func(s *rawStream) {
		if s.path == "/" {
			s.headers(false, ":status", "200", "content-length", "2")
			s.data(true, []byte("ok"))
			return
		}
		parts := strings.Split(strings.TrimPrefix(s.path, "/flood/"), "/")
		n, _ := strconv.Atoi(parts[1])
		for range n {
			switch parts[0] {
			case "trailer":
				// 1.6 KiB in HPACK's count, of which the map keeps 600.
				s.headers(false, ":status", "103", "link", strings.Repeat("l", 500), "trailer", strings.Repeat("t", 1000))
			case "status":
				// 1.6 KiB in HPACK's count, of which relay1xx sees 600.
				s.headers(false, ":status", strings.Repeat("0", 997)+"103", "link", strings.Repeat("l", 500))
			}
		}
		s.headers(false, ":status", "200", "content-length", "2")
		s.data(true, []byte("ok"))
	})
	owner, client, ref := limitedH2Pair(t, up.url, limit)
	for _, kind := range []string{"trailer", "status"} {
		const n = 60 // 60 × ~1.6 KiB ≈ 96 KiB on the wire, ≈ 36 KiB in the map
		outs := eachH2PathVia(ref, owner, client, getVia(up.url+"/flood/"+kind+"/"+strconv.Itoa(n)))
		if outs["x/net"].err == "" || outs["owner"].err == "" {
			t.Fatalf("%s: reference changed: x/net %+v, local %+v", kind, outs["x/net"], outs["owner"])
		}
		if g := outs["sibling"]; g.err == "" {
			t.Errorf("%s: %d interim heads of ~1.6 KiB each on the wire under a %d-byte limit, caller not looking at them: net/http's HTTP/2 client fails (%q) and so does the owner-local path (%q), but through a sibling: status %d body %q, no error",
				kind, n, limit, outs["x/net"].err, outs["owner"].err, g.status, g.body)
		}
	}
	if s := client.node.Stats(); s.ReusedRemote == 0 {
		t.Errorf("the sibling's request did not go through the owner: %+v", s)
	}
}
