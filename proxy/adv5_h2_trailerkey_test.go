package proxy

import (
	"context"
	"net/http"
	"testing"
	"time"
)

// TestAdv5H2ForbiddenTrailerNameThroughSibling: an HTTP/2 upstream that
// announces a trailer named Content-Length (which HTTP/1.1 forbids as a
// trailer) is read by x/net/http2 without complaint: body and the other
// trailers. Through a sibling the response must read the same, not fail
// in the unix leg's HTTP/1.1 parser with "bad trailer key".
func TestAdv5H2ForbiddenTrailerNameThroughSibling(t *testing.T) {
	up := newRawH2(t, func(s *rawStream) {
		switch s.path {
		case "/t":
			s.headers(false, ":status", "200", "trailer", "content-length, x-a")
			s.data(false, []byte("body"))
			s.headers(true, "x-a", "1")
		default:
			s.headers(false, ":status", "200")
			s.data(true, []byte("ok"))
		}
	})
	owner, client := h2Pair(t, up.url)
	ref := refH2C()
	defer ref.CloseIdleConnections()
	for i, rt := range []http.RoundTripper{ref, owner.tr, client.tr} {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		req, _ := http.NewRequestWithContext(ctx, "GET", up.url+"/t", nil)
		o := roundTripOutcome(rt, req)
		cancel()
		if o.err != "" || o.status != 200 || o.body != "body" || o.trailer.Get("X-A") != "1" {
			t.Errorf("%s: %+v; want the body and trailer X-A", []string{"x/net", "owner", "sibling"}[i], o)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := getOK(client, ctx, up.url+"/"); err != nil {
		t.Errorf("the sibling's next request: %v", err)
	}
}
