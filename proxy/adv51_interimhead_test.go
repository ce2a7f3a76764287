package proxy

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"strings"
	"testing"
	"time"
)

// TestAdv51InterimThenHeadTooLargeThroughSibling: an upstream answers with
// an interim response that reaches the caller (a 103 to a caller whose
// trace has Got1xxResponse, as Caddy's reverse proxy always has; a 100 to
// a request with Expect: 100-continue) and then a final head over the
// header limit. net/http and orbit's local path fail with the header limit
// (ErrHeaderTooLarge), and so must a sibling: the owner has relayed the 1xx
// (and its accept) by then, and reports the failure with an error frame in
// place of the head. Before it could only close the unix stream, which the
// sibling took for a dead owner (ErrOwnerGone), dropping its streams to
// that owner's lane.
func TestAdv51InterimThenHeadTooLargeThroughSibling(t *testing.T) {
	const limit = 64 << 10
	big := "X-Big: " + strings.Repeat("a", 70<<10) + "\r\n"
	cases := []struct {
		name   string
		interm string
		expect bool
	}{
		{"103-hook", "HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n", false},
		{"100-expect", "HTTP/1.1 100 Continue\r\n\r\n", true},
	}
	for _, c := range cases {
		for _, remote := range []bool{false, true} {
			name := c.name + map[bool]string{false: "/local", true: "/remote"}[remote]
			t.Run(name, func(t *testing.T) {
				u := newAdv10Upstream(t, false, func(nc net.Conn, br *bufio.Reader, req *http.Request, conn, n int) bool {
					if req.URL.Path != "/big" {
						return adv10Fresh(nc, req, conn, n)
					}
					io.WriteString(nc, c.interm)
					io.Copy(io.Discard, req.Body)
					io.WriteString(nc, "HTTP/1.1 200 OK\r\n"+big+"Content-Length: 2\r\n\r\nok")
					return false
				})
				conf := u.conf(func(tr *Transport) { tr.MaxResponseHeaderBytes = limit })
				var rt http.RoundTripper
				var owner *member
				if remote {
					var client *member
					owner, client = remotePair(t, conf)
					rt = client.tr
				} else {
					owner = localTransportMember(t, conf)
					rt = owner.tr
				}
				warm(t, owner, u.url("/warm"))
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				var got1xx []int
				if !c.expect {
					ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
						Got1xxResponse: func(code int, _ textproto.MIMEHeader) error {
							got1xx = append(got1xx, code)
							return nil
						}})
				}
				req, _ := http.NewRequestWithContext(ctx, "POST", u.url("/big"), strings.NewReader("hello"))
				if c.expect {
					req.Header.Set("Expect", "100-continue")
				}
				resp, err := rt.RoundTrip(req)
				if err == nil {
					drain(resp)
				}
				if !errors.Is(err, ErrHeaderTooLarge) || errors.Is(err, ErrOwnerGone) {
					t.Errorf("%s then a %d-byte final head under a %d-byte limit: %v; want ErrHeaderTooLarge, as net/http and the local path report it (1xx seen: %v)",
						strings.Fields(c.interm)[1], len(big), limit, err, got1xx)
				}
			})
		}
	}
}
