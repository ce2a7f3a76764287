package proxy

import (
	"testing"
)

// TestAdv33H2OverlongBodyLikeNetHTTP: an HTTP/2 upstream that sends more
// DATA than its declared Content-Length. net/http's HTTP/2 client (and the
// owner's exchange) gives the caller the declared bytes, then an error
// ("server replied with more than declared Content-Length; truncated").
// Through a sibling the caller gets an error too, but none of the bytes:
// the owner's relay had them in its buffer and returned the read's error
// without flushing them (copyBody), and the stream was closed.
func TestAdv33H2OverlongBodyLikeNetHTTP(t *testing.T) {
	outs, _ := rawH2Outcomes(t, "GET", "/long", func(s *rawStream) {
		s.headers(false, ":status", "200", "content-length", "2")
		s.data(true, []byte("part"))
	})
	for _, name := range h2Paths {
		o := outs[name]
		if o.status != 200 || o.length != 2 || o.body != "pa" || o.err == "" {
			t.Errorf("%s: status %d length %d body %q err %q; want 200, 2, \"pa\" and an error, as net/http", name, o.status, o.length, o.body, o.err)
		}
	}
}
