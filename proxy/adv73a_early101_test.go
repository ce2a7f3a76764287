package proxy

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestAdv73aEarly101BeforeBody: the upstream answers a POST (Expect:
// 100-continue, or none; with or without its own Upgrade request) with a 101
// before reading any of its body, then writes what reads as a complete next
// response ("SMUGGLED"), and keeps the connection open, reading on. Locally
// and through a sibling, plain and TLS: the connection that saw the 101 is
// never used again (the next request arrives on another connection), and the
// next requests each get their own answer, never the smuggled one.
func TestAdv73aEarly101BeforeBody(t *testing.T) {
	for _, tc := range []struct {
		name    string
		expect  bool
		upgrade bool
		noproto bool // the 101 names no protocol
		quiet   bool // the upstream reads the body, and sends nothing after the 101
	}{
		{"expect", true, false, false, false},
		{"noexpect", false, false, false, false},
		{"expect-upgrade", true, true, false, false},
		{"upgrade", false, true, false, false},
		{"expect-noproto", true, false, true, false},
		{"noproto", false, false, true, false},
		{"noproto-quiet", false, false, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mk := func(t *testing.T, withTLS bool) *adv10Upstream {
				return newAdv10Upstream(t, withTLS, func(c net.Conn, br *bufio.Reader, req *http.Request, conn, n int) bool {
					if req.URL.Path != "/up" {
						return adv10Fresh(c, req, conn, n)
					}
					head := "HTTP/1.1 101 Switching Protocols\r\nUpgrade: evil\r\nConnection: Upgrade\r\n\r\n"
					if tc.noproto {
						head = "HTTP/1.1 101 Switching Protocols\r\n\r\n"
					}
					if tc.quiet {
						io.Copy(io.Discard, req.Body)
						io.WriteString(c, head)
						return true
					}
					io.WriteString(c, head+"HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\nSMUGGLED")
					return true
				})
			}
			adv10Paths(t, mk, func(t *testing.T, u *adv10Upstream, rt http.RoundTripper, owner *member) {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				req, _ := http.NewRequestWithContext(ctx, "POST", u.url("/up"), strings.NewReader(strings.Repeat("b", 1000)))
				if tc.expect {
					req.Header.Set("Expect", "100-continue")
				}
				if tc.upgrade {
					req.Header.Set("Connection", "Upgrade")
					req.Header.Set("Upgrade", "evil")
				}
				resp, err := rt.RoundTrip(req)
				if err == nil {
					if resp.StatusCode == 200 {
						b, _ := io.ReadAll(resp.Body)
						t.Errorf("the POST got 200 %q: the bytes after the 101", b)
					}
					resp.Body.Close()
				}
				for i, p := range []string{"/after1", "/after2", "/after3"} {
					resp, body, err := adv10Do(t, rt, "GET", u.url(p), nil)
					if err != nil {
						t.Fatalf("GET %s after the 101: %v", p, err)
					}
					if resp.StatusCode != 200 || !strings.HasSuffix(body, " "+p) {
						t.Fatalf("GET %s (#%d) after the 101: %d %q, not its own answer", p, i, resp.StatusCode, body)
					}
				}
				var upConn string
				for _, r := range u.requests() {
					f := strings.Fields(r)
					if f[2] == "/up" {
						upConn = f[0]
					}
				}
				for _, r := range u.requests() {
					f := strings.Fields(r)
					if upConn != "" && f[0] == upConn && strings.HasPrefix(f[2], "/after") {
						t.Errorf("%s arrived on the connection that answered 101: %v", f[2], u.requests())
					}
				}
			})
		})
	}
}
