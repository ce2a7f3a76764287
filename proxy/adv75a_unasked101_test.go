package proxy

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestAdv75aUnasked101NeverPooled: an upstream answers an ordinary GET (no
// Upgrade asked) with a 101 that does name a protocol (Upgrade: websocket,
// Connection: Upgrade), followed by bytes that look like a response. Whatever
// the caller gets (net/http hands over the connection as a writable body;
// Caddy's ReverseProxy then answers 502 "backend tried to switch protocol"),
// the connection has left HTTP: it never serves another request, locally or
// for a sibling, and the next requests get their own answers on a fresh
// connection.
func TestAdv75aUnasked101NeverPooled(t *testing.T) {
	mk := func(t *testing.T, withTLS bool) *adv10Upstream {
		return newAdv10Upstream(t, withTLS, func(c net.Conn, br *bufio.Reader, req *http.Request, conn, n int) bool {
			if req.URL.Path == "/sneaky" {
				io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"+
					"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nEVIL")
				// Stays in HTTP itself: it would answer a next request.
				return true
			}
			return adv10Fresh(c, req, conn, n)
		})
	}
	adv10Paths(t, mk, func(t *testing.T, u *adv10Upstream, rt http.RoundTripper, owner *member) {
		for round := range 2 {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			req, _ := http.NewRequestWithContext(ctx, "GET", u.url("/sneaky"), nil)
			resp, err := rt.RoundTrip(req)
			if err == nil {
				// As ReverseProxy does with a 101 it did not ask for:
				// close the body without using it.
				resp.Body.Close()
			}
			cancel()
			time.Sleep(20 * time.Millisecond)
			for i := range 2 {
				resp, body, err := adv10Do(t, rt, "GET", u.url("/next"), nil)
				adv10CheckOwn(t, fmt.Sprintf("round %d, GET %d", round, i), resp, body, err, "/next")
				if i == 0 && !strings.Contains(body, " r1 ") {
					t.Fatalf("round %d: /next answered %q: the connection that answered 101 served another request", round, body)
				}
			}
		}
	})
}
