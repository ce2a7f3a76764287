package proxy

import (
	"context"
	"net/http"
	"testing"
	"time"
)

// TestAdv33H2HeaderValueSpacesLikeNetHTTP: HTTP/2 carries a header value
// as a string, leading and trailing spaces and tabs included, and
// net/http's HTTP/2 client (x/net/http2) gives it to the caller as it came;
// so does the owner's exchange. Through a sibling the response crosses the
// unix leg as HTTP/1.1, whose parser trims the value: the sibling's caller
// gets other bytes than net/http's (and the owner's) for the same answer,
// in a header and in a trailer.
func TestAdv33H2HeaderValueSpacesLikeNetHTTP(t *testing.T) {
	up := newRawH2(t, func(s *rawStream) {
		if s.path == "/" {
			s.headers(false, ":status", "200", "content-length", "2")
			s.data(true, []byte("ok"))
			return
		}
		s.headers(false, ":status", "200", "x-sp", "  a b  ", "x-tab", "\tq\t", "trailer", "x-tr")
		s.data(false, []byte("ok"))
		s.headers(true, "x-tr", " t ")
	})
	owner, client := h2Pair(t, up.url)
	ref := refH2C()
	defer ref.CloseIdleConnections()
	for _, name := range []string{"x/net", "owner", "sibling"} {
		rt := map[string]http.RoundTripper{"x/net": ref, "owner": owner.tr, "sibling": client.tr}[name]
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		req, _ := http.NewRequestWithContext(ctx, "GET", up.url+"/spaces", nil)
		o := roundTripOutcome(rt, req)
		cancel()
		if o.err != "" || o.status != 200 || o.body != "ok" {
			t.Errorf("%s: %+v", name, o)
			continue
		}
		if got := o.header.Values("X-Sp"); len(got) != 1 || got[0] != "  a b  " {
			t.Errorf("%s: X-Sp %q; want [\"  a b  \"] as sent, as net/http gives it", name, got)
		}
		if got := o.header.Values("X-Tab"); len(got) != 1 || got[0] != "\tq\t" {
			t.Errorf("%s: X-Tab %q; want [\"\\tq\\t\"] as sent, as net/http gives it", name, got)
		}
		if got := o.trailer.Values("X-Tr"); len(got) != 1 || got[0] != " t " {
			t.Errorf("%s: trailer X-Tr %q; want [\" t \"] as sent, as net/http gives it", name, got)
		}
	}
}
