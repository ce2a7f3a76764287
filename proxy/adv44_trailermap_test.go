package proxy

import (
	"context"
	"net/http"
	"reflect"
	"testing"
)

// TestAdv44AnnouncedTrailerKeysLikeNetHTTP: x/net/http2 puts every key an
// HTTP/2 response announces in its "trailer" field into resp.Trailer, with
// a nil value, before the body is read, whether the response has a body
// or not, and keeps the keys whose value never came. Through a sibling:
//   - a HEAD answer (no body on the unix leg) crosses without its
//     announcement, and resp.Trailer is nil;
//   - an announced "orbit-padded" key whose field the upstream never sent
//     is deleted from resp.Trailer when another trailer's value was wrapped
//     (unwrapPadded deletes the whole key before it restores the moved
//     values).
func TestAdv44AnnouncedTrailerKeysLikeNetHTTP(t *testing.T) {
	up := newRawH2(t, func(s *rawStream) {
		switch s.path {
		case "/":
			s.headers(false, ":status", "200", "content-length", "2")
			s.data(true, []byte("ok"))
		case "/head":
			s.headers(true, ":status", "200", "content-length", "2", "trailer", "x-status")
		case "/padded":
			s.headers(false, ":status", "200", "trailer", "orbit-padded, x-a")
			s.data(false, []byte("ok"))
			s.headers(true, "x-a", " a ")
		}
	})
	owner, client := h2Pair(t, up.url)
	for _, tc := range []struct{ method, path string }{{"HEAD", "/head"}, {"GET", "/padded"}} {
		outs := eachH2Path(owner, client, func(ctx context.Context) *http.Request {
			req, _ := http.NewRequestWithContext(ctx, tc.method, up.url+tc.path, nil)
			return req
		})
		ref := outs["x/net"]
		if ref.err != "" || ref.status != 200 || len(ref.trailer) == 0 {
			t.Fatalf("%s %s x/net: %+v; the reference itself changed", tc.method, tc.path, ref)
		}
		for _, name := range h2Paths[1:] {
			o := outs[name]
			if o.err != "" || o.status != 200 {
				t.Errorf("%s %s %s: %+v", tc.method, tc.path, name, o)
				continue
			}
			if !reflect.DeepEqual(o.trailer, ref.trailer) {
				t.Errorf("%s %s %s: resp.Trailer %#v; net/http's HTTP/2 client gives %#v", tc.method, tc.path, name, o.trailer, ref.trailer)
			}
		}
	}
	if st := client.node.Stats(); st.ReusedRemote == 0 {
		t.Errorf("the sibling's requests did not go through the owner (%+v)", st)
	}
}
