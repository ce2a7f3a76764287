package proxy

import (
	"strconv"
	"strings"
	"testing"
)

// TestAdv51H2InterimOverLimitThroughSibling: adv50's interim flood, over an
// HTTP/2 upstream. A caller that does not look at interim responses (no
// Got1xxResponse) bounds all the interim heads of a response by its header
// limit: net/http's HTTP/2 client refuses 96 KiB of 103s before the final
// head under a 64 KiB MaxResponseHeaderBytes ("header list too large"), and
// so does orbit's local path. Through a sibling the owner's x/net client has
// the relay as its hook, which must bound them as net/http would, no more
// and no less: 61 heads, just under the limit and its 320-byte allowance for
// field overhead, pass everywhere.
func TestAdv51H2InterimOverLimitThroughSibling(t *testing.T) {
	const limit = 64 << 10
	up := newRawH2(t, func(s *rawStream) {
		if s.path == "/" {
			s.headers(false, ":status", "200", "content-length", "2")
			s.data(true, []byte("ok"))
			return
		}
		n, _ := strconv.Atoi(strings.TrimPrefix(s.path, "/flood/"))
		v := strings.Repeat("a", 1000)
		for range n {
			s.headers(false, ":status", "103", "link", v)
		}
		s.headers(false, ":status", "200", "content-length", "2")
		s.data(true, []byte("ok"))
	})
	owner, client, ref := limitedH2Pair(t, up.url, limit)
	// 1078 bytes a head in HPACK's count: 61 are under 64 KiB and 320
	// bytes, 62 over.
	for _, n := range []int{61, 62, 96} {
		outs := eachH2PathVia(ref, owner, client, getVia(up.url+"/flood/"+strconv.Itoa(n)))
		over := n > 61
		if (outs["x/net"].err != "") != over || (outs["owner"].err != "") != over {
			t.Fatalf("%d heads: reference changed: x/net %+v, local %+v", n, outs["x/net"], outs["owner"])
		}
		if g := outs["sibling"]; (g.err != "") != over {
			t.Errorf("%d KiB of 103s under a %d-byte header limit, caller not looking at them: the sibling got status %d body %q error %q; net/http's client: %q, the local path: %q",
				n, limit, g.status, g.body, g.err, outs["x/net"].err, outs["owner"].err)
		}
	}
	if s := client.node.Stats(); s.ReusedRemote == 0 {
		t.Errorf("the sibling's request did not go through the owner: %+v", s)
	}
}
