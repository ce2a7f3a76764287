package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestAdv10StrayRecordAfterFullRecord: a response that fills one TLS record
// exactly (16 KiB of plaintext, as nginx sends them), followed by a response
// nobody asked for in a record of its own: in the same write (so crypto/tls
// may have read the second record off the socket with the first, where
// neither bufio nor a peek at the socket sees it), or a moment later. The
// body is read as a proxy reads it, in large reads that bypass bufio. The
// next request, local or a sibling's on the owner's connection, gets its
// own answer; the connection with the stray record is not reused. Plain
// TCP too, where the boundary is that of bufio's buffer.
func TestAdv10StrayRecordAfterFullRecord(t *testing.T) {
	const record = 16 << 10
	stray := "HTTP/1.1 200 OK\r\nContent-Length: 13\r\n\r\nSTRAY-RECORD!"
	resp := func(size int) string {
		head := ""
		for n := size; ; n-- {
			head = fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n", n)
			if len(head)+n == size {
				return head + strings.Repeat("r", n)
			}
		}
	}
	later := newAdv10Later()
	mk := func(t *testing.T, withTLS bool) *adv10Upstream {
		return newAdv10Upstream(t, withTLS, func(c net.Conn, br *bufio.Reader, req *http.Request, conn, n int) bool {
			switch req.URL.Path {
			case "/full-same":
				io.WriteString(c, resp(record))
				io.WriteString(c, stray) // a record of its own, right behind
				return true
			case "/full-later":
				io.WriteString(c, resp(record))
				time.Sleep(time.Millisecond)
				io.WriteString(c, stray)
				later.sent()
				return true
			case "/buf-same":
				// Ends where bufio's 4 KiB buffer of the head ends.
				io.WriteString(c, resp(readBufSize)+stray)
				return true
			}
			return adv10Fresh(c, req, conn, n)
		})
	}
	for _, path := range []string{"/full-same", "/full-later", "/buf-same"} {
		t.Run(path[1:], func(t *testing.T) {
			adv10Paths(t, mk, func(t *testing.T, u *adv10Upstream, rt http.RoundTripper, owner *member) {
				for round := range 3 {
					req, _ := http.NewRequest("GET", u.url(path), nil)
					r, err := rt.RoundTrip(req)
					if err != nil {
						t.Fatalf("round %d: %v", round, err)
					}
					var b strings.Builder
					_, err = io.CopyBuffer(&b, r.Body, make([]byte, 32<<10))
					r.Body.Close()
					if err != nil || int64(b.Len()) != r.ContentLength || strings.Trim(b.String(), "r") != "" {
						t.Fatalf("round %d: %d bytes of %d, %v", round, b.Len(), r.ContentLength, err)
					}
					if path == "/full-later" {
						later.wait(t)
					}
					time.Sleep(10 * time.Millisecond)
					resp, body, err := adv10Do(t, rt, "GET", u.url("/next"), nil)
					adv10CheckOwn(t, fmt.Sprintf("round %d: GET after", round), resp, body, err, "/next")
				}
			})
		})
	}
}
