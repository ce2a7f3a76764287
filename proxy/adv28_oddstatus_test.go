package proxy

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"testing"
)

// TestAdv28StatusBelow100NotReused: a final status under 100 ("099"),
// which net/http's reader takes and its Transport never keeps the
// connection after (it keeps none after a status of 199 or less). Locally
// and on the owner's connection for a sibling, the connection that carried
// it is not reused either: the next request gets a fresh one.
func TestAdv28StatusBelow100NotReused(t *testing.T) {
	mk := func(t *testing.T, withTLS bool) *adv10Upstream {
		return newAdv10Upstream(t, withTLS, func(c net.Conn, br *bufio.Reader, req *http.Request, conn, n int) bool {
			if req.URL.Path == "/odd" {
				io.WriteString(c, "HTTP/1.1 099 Odd\r\nContent-Length: 2\r\n\r\nhi")
				return true
			}
			return adv10Fresh(c, req, conn, n)
		})
	}
	{
		u := mk(t, false)
		ref := u.refTransport(t)
		resp, body, err := adv10Do(t, ref, "GET", u.url("/odd"), nil)
		if err != nil || resp.StatusCode != 99 || body != "hi" {
			t.Fatalf("net/http: %v %q", err, body)
		}
		adv10Do(t, ref, "GET", u.url("/next"), nil)
		if n := u.conns.Load(); n != 2 {
			t.Fatalf("net/http used %d connections, want 2", n)
		}
	}
	adv10Paths(t, mk, func(t *testing.T, u *adv10Upstream, rt http.RoundTripper, owner *member) {
		resp, body, err := adv10Do(t, rt, "GET", u.url("/odd"), nil)
		if err != nil || resp.StatusCode != 99 || body != "hi" {
			t.Fatalf("/odd: %v %q, want 099 \"hi\" as net/http", err, body)
		}
		resp, body, err = adv10Do(t, rt, "GET", u.url("/next"), nil)
		adv10CheckOwn(t, "GET after /odd", resp, body, err, "/next")
		if n := u.conns.Load(); n != 2 {
			t.Errorf("%d upstream connections for /warm, /odd, /next; want 2: the one after the 099 is not reused, as by net/http", n)
		}
	})
}
