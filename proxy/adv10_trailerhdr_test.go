package proxy

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"reflect"
	"testing"
)

// TestAdv10CloseDelimitedTrailerHeaderLikeNetHTTP: a body delimited by the
// upstream closing may come with a Trailer header (an HTTP/1.0 upstream
// that also sent Transfer-Encoding, which HTTP/1.0 ignores; or a plain
// mistake). net/http keeps it in the header, announces no trailers, and
// does not judge its keys. The unix leg frames such a body as chunked, and
// a sibling's reader must not then take the header as announcing trailers
// (nor refuse the response for a key such as Content-Length): the sibling
// sees what net/http and the local path see.
func TestAdv10CloseDelimitedTrailerHeaderLikeNetHTTP(t *testing.T) {
	cases := map[string]string{
		"/eof-trailer":     "HTTP/1.1 200 OK\r\nTrailer: X-T, X-U\r\n\r\nread until close",
		"/eof-trailer-bad": "HTTP/1.1 200 OK\r\nTrailer: Content-Length\r\n\r\nread until close",
		"/http10-te":       "HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-T\r\n\r\n5\r\nhello\r\n0\r\nX-T: v\r\n\r\n",
	}
	mk := func(t *testing.T, withTLS bool) *adv10Upstream {
		return newAdv10Upstream(t, withTLS, func(c net.Conn, br *bufio.Reader, req *http.Request, conn, n int) bool {
			if raw, ok := cases[req.URL.Path]; ok {
				io.WriteString(c, raw)
				return false
			}
			return adv10Fresh(c, req, conn, n)
		})
	}
	type seen struct {
		Err     bool
		Status  int
		Body    string
		Header  []string
		Trailer http.Header
	}
	observe := func(t *testing.T, rt http.RoundTripper, url string) seen {
		resp, body, err := adv10Do(t, rt, "GET", url, nil)
		if err != nil {
			t.Logf("%s: %v", url, err)
			return seen{Err: true}
		}
		return seen{Status: resp.StatusCode, Body: body, Header: resp.Header["Trailer"], Trailer: resp.Trailer}
	}
	want := make(map[string]seen)
	u := mk(t, false)
	ref := u.refTransport(t)
	for p := range cases {
		want[p] = observe(t, ref, u.url(p))
		if w := want[p]; w.Err || w.Header == nil || w.Trailer != nil {
			t.Fatalf("net/http %s: %+v; the test's premise is a response with the header kept and no trailers", p, w)
		}
	}
	adv10Paths(t, mk, func(t *testing.T, u *adv10Upstream, rt http.RoundTripper, owner *member) {
		for p := range cases {
			warm(t, owner, u.url("/warm"))
			if got := observe(t, rt, u.url(p)); !reflect.DeepEqual(got, want[p]) {
				t.Errorf("%s: got %+v, net/http %+v", p, got, want[p])
			}
		}
	})
}
