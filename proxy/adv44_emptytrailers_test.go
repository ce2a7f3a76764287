package proxy

import (
	"context"
	"net/http"
	"testing"
)

// TestAdv44EmptyBodyTrailersLikeNetHTTP: net/http's own HTTP/2 server,
// for a handler that declares a trailer and writes no body, sends
// "content-length: 0" in the HEADERS (without END_STREAM) and the trailer
// in a HEADERS frame after. x/net/http2 gives ContentLength 0, a body that
// reads EOF, the announced key in resp.Trailer at once and its value after
// EOF (a gRPC-style status in a trailer of an empty answer). The owner's
// own exchange does the same. Through a sibling the relay takes
// ContentLength 0 for "no body" (hasBody), writes neither the Trailer
// announcement nor the trailer block, and the sibling's caller sees no
// trailers at all.
func TestAdv44EmptyBodyTrailersLikeNetHTTP(t *testing.T) {
	up := newH2CServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/" {
			w.Write([]byte("ok"))
			return
		}
		w.Header().Set("Trailer", "X-Status")
		w.WriteHeader(200)
		w.Header().Set("X-Status", "0")
	})
	owner, client := h2Pair(t, up.url)
	outs := eachH2Path(owner, client, func(ctx context.Context) *http.Request {
		req, _ := http.NewRequestWithContext(ctx, "GET", up.url+"/empty", nil)
		return req
	})
	ref := outs["x/net"]
	if ref.err != "" || ref.status != 200 || ref.length != 0 || ref.trailer.Get("X-Status") != "0" {
		t.Fatalf("x/net: %+v; the reference itself changed", ref)
	}
	for _, name := range h2Paths[1:] {
		o := outs[name]
		if o.err != "" || o.status != 200 || o.body != "" {
			t.Errorf("%s: %+v", name, o)
			continue
		}
		if got := o.trailer.Values("X-Status"); len(got) != 1 || got[0] != "0" {
			t.Errorf("%s: trailer X-Status %q (trailer %q); net/http's HTTP/2 client gives [\"0\"] (length %d)", name, got, o.trailer, ref.length)
		}
	}
	if st := client.node.Stats(); st.ReusedRemote == 0 {
		t.Errorf("the sibling's request did not go through the owner (%+v)", st)
	}
}
