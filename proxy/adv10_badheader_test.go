package proxy

import (
	"bufio"
	"net"
	"net/http"
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
