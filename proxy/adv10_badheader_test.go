package proxy

import (
	"bufio"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
)

// TestAdv10InvalidHeaderRefusedLikeNetHTTP: a request whose header has a
// field name net/http will not write or a value with control bytes is
// refused before anything is sent, as net/http's Transport refuses it:
// Request.Write would drop the field silently, or send the control bytes to
// the upstream as they are (a NUL that a parser may take for the end of the
// value), and through a sibling to an owner whose parser refuses the request.
// The next request is served as usual.
func TestAdv10InvalidHeaderRefusedLikeNetHTTP(t *testing.T) {
	bad := []http.Header{
		{"X-Bad": {"a\x00b"}},
		{"X-Bad": {"a\x7fb"}},
		{"X-Bad": {"a\rb"}},
		{"X-Bad": {"ok", "a\nb"}},
		{"Bad Name": {"v"}},
		{"Bad:Name": {"v"}},
	}
	mk := func(t *testing.T, withTLS bool) *adv10Upstream {
		return newAdv10Upstream(t, withTLS, func(c net.Conn, br *bufio.Reader, req *http.Request, conn, n int) bool {
			return adv10Fresh(c, req, conn, n)
		})
	}
	u := mk(t, false)
	for _, h := range bad {
		if _, _, err := adv10Do(t, u.refTransport(t), "GET", u.url("/ref"), h); err == nil || !strings.Contains(err.Error(), "invalid header field") {
			t.Fatalf("net/http sent %q: %v; the test's premise is a refusal", h, err)
		}
	}
	adv10Paths(t, mk, func(t *testing.T, u *adv10Upstream, rt http.RoundTripper, owner *member) {
		for _, h := range bad {
			_, body, err := adv10Do(t, rt, "GET", u.url("/bad"), h)
			if err == nil || !strings.Contains(err.Error(), "invalid header field") {
				t.Errorf("header %q: %q %v, want a refusal naming the invalid field", h, body, err)
			}
		}
		for _, r := range u.requests() {
			if strings.HasSuffix(r, "/bad") {
				t.Errorf("an invalid header reached the upstream: %q", u.requests())
				break
			}
		}
		resp, body, err := adv10Do(t, rt, "GET", u.url("/next"), nil)
		adv10CheckOwn(t, "GET after the refusals", resp, body, err, "/next")
	})
}

// TestAdv10InvalidMethodRefusedLikeNetHTTP: a method that is not a token is
// refused before anything is sent, as net/http's Transport refuses it.
// Request.Write writes the method as it is: one carrying CRLF and a request
// line of its own made the upstream read two requests from one exchange
// (request smuggling), the second answered on a connection nobody read it
// from; through a sibling, the owner read the first as the request.
func TestAdv10InvalidMethodRefusedLikeNetHTTP(t *testing.T) {
	bad := []string{
		"GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\nGET",
		"GET /smuggled",
		"G\x00T",
	}
	mk := func(t *testing.T, withTLS bool) *adv10Upstream {
		return newAdv10Upstream(t, withTLS, func(c net.Conn, br *bufio.Reader, req *http.Request, conn, n int) bool {
			return adv10Fresh(c, req, conn, n)
		})
	}
	do := func(rt http.RoundTripper, u *adv10Upstream, method string) error {
		req, _ := http.NewRequest("GET", u.url("/bad"), nil)
		req.Method = method
		resp, err := rt.RoundTrip(req)
		if err == nil {
			resp.Body.Close()
		}
		return err
	}
	u := mk(t, false)
	for _, m := range bad {
		if err := do(u.refTransport(t), u, m); err == nil || !strings.Contains(err.Error(), "invalid method") {
			t.Fatalf("net/http sent method %q: %v; the test's premise is a refusal", m, err)
		}
	}
	adv10Paths(t, mk, func(t *testing.T, u *adv10Upstream, rt http.RoundTripper, owner *member) {
		for _, m := range bad {
			if err := do(rt, u, m); err == nil || !strings.Contains(err.Error(), "invalid method") {
				t.Errorf("method %q: %v, want a refusal naming the invalid method", m, err)
			}
		}
		resp, body, err := adv10Do(t, rt, "GET", u.url("/next"), nil)
		adv10CheckOwn(t, "GET after the refusals", resp, body, err, "/next")
		for _, r := range u.requests() {
			if strings.Contains(r, "/bad") || strings.Contains(r, "/smuggled") {
				t.Errorf("a request with an invalid method reached the upstream: %q", u.requests())
				break
			}
		}
	})
}

// TestAdv10ControlBytesInURLCostNoConnection: a request line with control
// bytes (in a raw query or an opaque target) is refused, as Request.Write refuses
// it, before a connection or a sibling's stream is taken: the write that
// refused it tore down the pooled connection it had taken, and each retry
// another.
func TestAdv10ControlBytesInURLCostNoConnection(t *testing.T) {
	mk := func(t *testing.T, withTLS bool) *adv10Upstream {
		return newAdv10Upstream(t, withTLS, func(c net.Conn, br *bufio.Reader, req *http.Request, conn, n int) bool {
			return adv10Fresh(c, req, conn, n)
		})
	}
	adv10Paths(t, mk, func(t *testing.T, u *adv10Upstream, rt http.RoundTripper, owner *member) {
		for what, set := range map[string]func(*url.URL){
			"a raw query with a newline":  func(u *url.URL) { u.RawQuery = "a=\nb" },
			"an opaque target with a DEL": func(u *url.URL) { u.Opaque = "/q\x7f" },
		} {
			req, _ := http.NewRequest("GET", u.url("/q"), nil)
			set(req.URL)
			if _, err := rt.RoundTrip(req); err == nil || !strings.Contains(err.Error(), "control character") {
				t.Errorf("%s: %v, want a refusal", what, err)
			}
		}
		resp, body, err := adv10Do(t, rt, "GET", u.url("/next"), nil)
		adv10CheckOwn(t, "next request", resp, body, err, "/next")
		if n := u.conns.Load(); n != 1 {
			t.Errorf("%d upstream connections, want the warm-up's only", n)
		}
		if s := owner.node.Stats(); s.Retired != 0 {
			t.Errorf("owner %+v: a connection was torn down for a request that could not be written", s)
		}
	})
}
