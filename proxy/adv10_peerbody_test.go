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

// TestAdv10MalformedPeerBodyBreaksUpstreamConn: a sibling (here a raw
// stream, with a real lease on the owner's connection) whose request body
// is malformed after the owner accepted it: a bad chunk size, or a chunked
// body cut short by the stream closing. The owner has written the request
// head upstream by then: its connection must not carry another exchange
// (the upstream is waiting for the rest of a body), the lease's capacity
// must come back, and the next request, a sibling's, gets its own answer.
// A body that ends well but is followed by bytes that are not a frame
// costs only the stream: the upstream connection carries the next request.
func TestAdv10MalformedPeerBodyBreaksUpstreamConn(t *testing.T) {
	for _, tc := range []struct {
		name, after string
		closeStream bool
		conns       int32 // upstream connections at the end
	}{
		{"bad-chunk-size", "zz\r\nhello\r\n0\r\n\r\n", false, 2},
		{"cut-short", "5\r\nhel", true, 2},
		{"garbage-after-body", "5\r\nhello\r\n0\r\n\r\nNOT A FRAME AT ALL......", false, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := newAdv10Upstream(t, false, func(c net.Conn, br *bufio.Reader, req *http.Request, conn, n int) bool {
				if req.Method == "GET" {
					return adv10Fresh(c, req, conn, n)
				}
				b, err := io.ReadAll(req.Body)
				if err != nil {
					return false
				}
				body := fmt.Sprintf("c%d r%d %s got %q", conn, n, req.URL.Path, b)
				fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
				return true
			})
			owner, client := remotePair(t, nil)
			warm(t, owner, u.url("/warm"))
			kreq, _ := http.NewRequest("GET", u.url("/"), nil)
			_, key, err := client.tr.Upstream(kreq)
			if err != nil {
				t.Fatal(err)
			}
			sc, frame := leasedStream(t, owner, client, key, 1, time.Now().Add(3*time.Second))
			sc.SetDeadline(time.Now().Add(5 * time.Second))
			host := strings.TrimPrefix(u.base, "http://")
			io.WriteString(sc, string(frame)+"POST /post HTTP/1.1\r\nHost: "+host+"\r\nTransfer-Encoding: chunked\r\n\r\n")
			br := bufio.NewReader(sc)
			if _, err := readFrame(br, respHeaderLen, decodeResponseFrame); err != nil {
				t.Fatalf("no accept: %v", err)
			}
			io.WriteString(sc, tc.after)
			if tc.closeStream {
				sc.(*net.UnixConn).CloseWrite()
			}
			start := time.Now()
			// Whatever the owner answers, the stream then ends.
			io.Copy(io.Discard, br)
			// The next request from the sibling, through the owner if its
			// connection survived, else on one of its own. The lease's
			// capacity comes back at once: the upstream, which has the
			// head, waits for the rest of a body that will not come, and
			// the owner does not wait with it until the frame's deadline.
			resp, body, err := adv10Do(t, client.tr, "GET", u.url("/next"), nil)
			adv10CheckOwn(t, "next request", resp, body, err, "/next")
			if took := time.Since(start); took > 1500*time.Millisecond {
				t.Errorf("the next request was served %v after the malformed body", took)
			}
			if n := u.conns.Load(); n != tc.conns {
				t.Errorf("%d upstream connections, want %d: %q", n, tc.conns, u.requests())
			}
		})
	}
}
