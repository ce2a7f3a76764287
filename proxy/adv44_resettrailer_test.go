package proxy

import (
	"testing"
	"time"

	"golang.org/x/net/http2"
)

// TestAdv44ResetLeavesTrailerNilLikeNetHTTP: an HTTP/2 upstream that
// announces no trailers and resets the stream mid-body. x/net/http2's
// caller reads the stream error and resp.Trailer stays nil (no trailers
// came; copyTrailers never ran), as the owner's own exchange gives it.
// Through a sibling the reset crosses as a chunked trailer of the unix
// leg's own (Orbit-Stream-Reset), for which net/http's chunked reader
// makes a Trailer map; takeStreamReset deletes the key and leaves an
// empty, non-nil map: a caller that tells "trailers came" by
// resp.Trailer != nil (or ranges over a map it expects nil) sees another
// answer than net/http gives.
func TestAdv44ResetLeavesTrailerNilLikeNetHTTP(t *testing.T) {
	outs, client := rawH2Outcomes(t, "GET", "/reset", func(s *rawStream) {
		s.headers(false, ":status", "200")
		s.data(false, []byte("part"))
		time.Sleep(20 * time.Millisecond)
		s.rst(http2.ErrCodeInternal)
	})
	ref := outs["x/net"]
	if ref.err == "" || ref.trailer != nil {
		t.Fatalf("x/net: %+v; the reference itself changed", ref)
	}
	for _, name := range h2Paths[1:] {
		o := outs[name]
		if o.err == "" || o.body != "part" {
			t.Errorf("%s: %+v; want \"part\" and the stream error", name, o)
			continue
		}
		if o.trailer != nil {
			t.Errorf("%s: resp.Trailer %#v after a reset; net/http's HTTP/2 client leaves it nil", name, o.trailer)
		}
	}
	if st := client.node.Stats(); st.ReusedRemote == 0 {
		t.Errorf("the sibling's request did not go through the owner (%+v)", st)
	}
}
