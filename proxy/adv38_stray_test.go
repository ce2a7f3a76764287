package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"
)

// TestAdv38StrayAfterBodylessAndLengthNotReused: an upstream that writes
// bytes after a complete 204, 304, 200 with Content-Length, or a 100 and a
// final 200, in the same write or a moment later: the next request on the
// connection, locally or a sibling's through the owner, gets its own answer,
// never those bytes, as net/http's does.
func TestAdv38StrayAfterBodylessAndLengthNotReused(t *testing.T) {
	const stray = "HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\nSTRAY /next"
	for _, path := range []string{"/204", "/304", "/200", "/100", "/204-later", "/200-later"} {
		t.Run(path[1:], func(t *testing.T) {
			// Each upstream says when it has written the stray bytes: the
			// next request is sent only then, so that they wait on the
			// connection (as bytes still on their way when the next
			// request goes are seen by nobody, here or in net/http).
			wrote := make(map[*adv10Upstream]chan struct{})
			mk := func(t *testing.T, withTLS bool) *adv10Upstream {
				ch := make(chan struct{}, 8)
				u := newAdv10Upstream(t, withTLS, func(c net.Conn, br *bufio.Reader, req *http.Request, conn, n int) bool {
					io.Copy(io.Discard, req.Body)
					var head string
					switch req.URL.Path {
					case "/204", "/204-later":
						head = "HTTP/1.1 204 No Content\r\n\r\n"
					case "/304":
						head = "HTTP/1.1 304 Not Modified\r\nContent-Length: 5\r\n\r\n"
					case "/200", "/200-later":
						head = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
					case "/100":
						head = "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
					default:
						return adv10Fresh(c, req, conn, n)
					}
					if len(req.URL.Path) > 4 {
						io.WriteString(c, head)
						time.Sleep(2 * time.Millisecond)
						io.WriteString(c, stray)
					} else {
						io.WriteString(c, head+stray)
					}
					ch <- struct{}{}
					return true
				})
				wrote[u] = ch
				return u
			}
			adv10Paths(t, mk, func(t *testing.T, u *adv10Upstream, rt http.RoundTripper, owner *member) {
				for round := range 3 {
					resp, _, err := adv10Do(t, rt, "GET", u.url(path), nil)
					if err != nil {
						t.Fatalf("round %d: %s: %v", round, path, err)
					}
					_ = resp
					select {
					case <-wrote[u]:
					case <-time.After(5 * time.Second):
						t.Fatalf("round %d: the upstream did not write its stray bytes within 5s", round)
					}
					time.Sleep(5 * time.Millisecond) // for a TLS record to be in the socket whole
					for i := range 2 {
						resp, body, err := adv10Do(t, rt, "GET", u.url("/next"), nil)
						adv10CheckOwn(t, fmt.Sprintf("round %d, GET %d", round, i), resp, body, err, "/next")
					}
				}
			})
		})
	}
}
