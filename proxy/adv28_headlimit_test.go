package proxy

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
)

// TestAdv28RelayedHeadWithinLimitLikeNetHTTP: a response head that
// net/http's Transport takes under MaxResponseHeaderBytes, written
// compactly by the upstream (header lines without a space after the colon,
// bare LF line ends, interim responses with no reason phrase). The owner
// relays every head anew, canonical, with its frame and markers: the same
// head grows on the unix leg (a line "a:\n" becomes "A: \r\n"). Through a
// sibling it must still be taken, as on the local path and by net/http.
func TestAdv28RelayedHeadWithinLimitLikeNetHTTP(t *testing.T) {
	const limit = 16 << 10
	cases := map[string]string{
		"/nospace": "HTTP/1.1 200 OK\r\n" + strings.Repeat("a:1\r\n", 2900) + "Content-Length: 2\r\n\r\nhi",
		"/barelf":  "HTTP/1.1 200 OK\n" + strings.Repeat("a:\n", 4500) + "Content-Length: 2\n\nhi",
		"/interim": strings.Repeat("HTTP/1.1 103\n\n", 900) + "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi",
	}
	for p, raw := range cases {
		if len(raw) > limit*9/10 {
			t.Fatalf("%s: %d bytes, not well under the limit", p, len(raw))
		}
	}
	mk := func(t *testing.T, withTLS bool) *adv10Upstream {
		return newAdv10Upstream(t, withTLS, func(c net.Conn, br *bufio.Reader, req *http.Request, conn, n int) bool {
			if raw, ok := cases[req.URL.Path]; ok {
				io.WriteString(c, raw)
				return true
			}
			return adv10Fresh(c, req, conn, n)
		})
	}
	setLimit := func(tr *Transport) { tr.MaxResponseHeaderBytes = limit }
	for _, withTLS := range []bool{false, true} {
		name := map[bool]string{false: "plain", true: "tls"}[withTLS]
		t.Run(name, func(t *testing.T) {
			u := mk(t, withTLS)
			ref := u.refTransport(t)
			ref.MaxResponseHeaderBytes = limit
			local := localTransportMember(t, u.conf(setLimit))
			warm(t, local, u.url("/warm"))
			owner, client := remotePair(t, u.conf(setLimit))
			warm(t, owner, u.url("/warm"))
			for p := range cases {
				for _, rt := range []struct {
					name string
					rt   http.RoundTripper
				}{{"net/http", ref}, {"local", local.tr}, {"sibling", client.tr}} {
					resp, body, err := adv10Do(t, rt.rt, "GET", u.url(p), nil)
					if err != nil || resp.StatusCode != 200 || body != "hi" {
						t.Errorf("%s %s: %v %q, want 200 \"hi\" as net/http", rt.name, p, err, body)
					}
				}
			}
		})
	}
}
