package proxy

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"testing"
	"time"
)

// TestAdv50Bogus101NotATunnel: an upstream answers an ordinary GET (no
// Upgrade asked) with "101 Switching Protocols" that names no protocol (no
// Upgrade, no Connection: upgrade), followed by other bytes. net/http's
// Transport switches only on a 101 whose header names an upgrade
// (Response.isProtocolSwitch): otherwise the 101 is a final response with
// no body (http.NoBody), and the connection is closed. orbit hijacks the
// connection on any 101 and hands the caller the raw upstream connection as
// a writable body, locally and through a sibling (the owner tunnels the
// unix stream to it), over plain TCP and TLS: the caller reads the
// upstream's following bytes as the 101's body. Behind a reverse proxy
// (net/http/httputil.ReverseProxy, as Caddy's), the request asked for no
// upgrade and the response names none, so the proxy takes the writable
// body for a switch and turns the client's keep-alive connection into a
// raw tunnel to the upstream, where net/http's Transport yields a 502: the
// upgrade smuggling THREATS.md names ("a proxy that believes an upgrade
// happened when the upstream refused it").
func TestAdv50Bogus101NotATunnel(t *testing.T) {
	mk := func(t *testing.T, withTLS bool) *adv10Upstream {
		return newAdv10Upstream(t, withTLS, func(c net.Conn, br *bufio.Reader, req *http.Request, conn, n int) bool {
			if req.URL.Path != "/bogus" {
				return adv10Fresh(c, req, conn, n)
			}
			io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nsecret")
			time.Sleep(100 * time.Millisecond)
			return false
		})
	}
	// see is what a caller of rt gets for GET /bogus.
	see := func(rt http.RoundTripper, u string) string {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", u, nil)
		resp, err := rt.RoundTrip(req)
		if err != nil {
			return "error: " + err.Error()
		}
		_, rw := resp.Body.(io.ReadWriteCloser)
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		return fmt.Sprintf("status %d, writable body %v, body %q (%v)", resp.StatusCode, rw, b, err)
	}
	// viaProxy is the status a client gets for GET /bogus from
	// httputil.ReverseProxy using rt.
	viaProxy := func(t *testing.T, rt http.RoundTripper, base string) int {
		target, _ := url.Parse(base)
		rp := &httputil.ReverseProxy{
			Rewrite: func(r *httputil.ProxyRequest) {
				r.SetURL(target)
				r.Out.RequestURI = "" // as caddymodule does
			},
			Transport: rt,
			ErrorLog:  log.New(io.Discard, "", 0),
		}
		front := httptest.NewServer(rp)
		defer front.Close()
		ct := &http.Transport{}
		defer ct.CloseIdleConnections()
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", front.URL+"/bogus", nil)
		resp, err := ct.RoundTrip(req)
		if err != nil {
			t.Fatalf("via proxy: %v", err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}

	var want string
	var wantProxy int
	t.Run("net/http", func(t *testing.T) {
		u := mk(t, false)
		want = see(u.refTransport(t), u.url("/bogus"))
		u2 := mk(t, false)
		wantProxy = viaProxy(t, u2.refTransport(t), u2.base)
		t.Logf("%s; via ReverseProxy %d", want, wantProxy)
	})
	if want != `status 101, writable body false, body "" (<nil>)` || wantProxy != http.StatusBadGateway {
		t.Fatalf("net/http's reference changed: %s, via proxy %d", want, wantProxy)
	}
	adv10Paths(t, mk, func(t *testing.T, u *adv10Upstream, rt http.RoundTripper, owner *member) {
		if got := see(rt, u.url("/bogus")); got != want {
			t.Errorf("a 101 that names no upgrade, to a request that asked for none:\n got  %s\n want %s (net/http)", got, want)
		}
		if got := viaProxy(t, rt, u.base); got != wantProxy {
			t.Errorf("httputil.ReverseProxy over it answers the client %d (a protocol switch: the client's connection is now a raw tunnel to the upstream); over net/http's Transport %d", got, wantProxy)
		}
	})
}
