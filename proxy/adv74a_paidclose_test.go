package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestAdv74aPaidConnClosedAfterRead: relays pay for a dial, and the
// upstream reads the first request on every new connection and closes it
// without a byte of answer (its first connection, the owner's, serves).
// The paid connection's failure is marked idleClosed (conn.relayPaid), the
// mark that lets a replayable request go again. Properties: a GET is
// served (sent again through the owner's connection); an unreplayable POST
// (RelayUnreplayable, so it too relays and pays) that reached the upstream
// is neither sent again nor failed retry-safe: the upstream sees each POST
// at most once, and a POST it saw never fails retry-safe.
func TestAdv74aPaidConnClosedAfterRead(t *testing.T) {
	for _, method := range []string{"GET", "POST"} {
		t.Run(method, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			var mu sync.Mutex
			saw := map[string]int{}
			var accepted atomic.Int32
			serveConns(t, ln, func(c net.Conn, id int) {
				accepted.Add(1)
				br := bufio.NewReader(c)
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					io.Copy(io.Discard, req.Body)
					mu.Lock()
					saw[req.Header.Get("X-Id")]++
					mu.Unlock()
					if id > 1 {
						return // read, then closed unanswered
					}
					io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
				}
			})
			url := "http://" + ln.Addr().String() + "/"
			ms := newFleet(t, 2, func(tr *Transport) { tr.RelayUnreplayable = true })
			owner, client := ms[0], ms[1]
			warm(t, owner, url)
			served, failed := 0, 0
			for i := range 4 * (relaysPerDial + 1) {
				id := fmt.Sprintf("%s%d", method, i)
				ctx, cancel := contextWithTimeout(3 * time.Second)
				var body io.Reader
				if method == "POST" {
					body = strings.NewReader("payload")
				}
				req, _ := http.NewRequestWithContext(ctx, method, url, body)
				req.Header.Set("X-Id", id)
				resp, err := client.tr.RoundTrip(req)
				cancel()
				mu.Lock()
				n := saw[id]
				mu.Unlock()
				switch {
				case err == nil:
					drain(resp)
					served++
				default:
					failed++
					if n > 0 && IsRetrySafe(err) {
						t.Errorf("%s %s reached the upstream %d times but failed retry-safe: %v", method, id, n, err)
					}
					if method == "GET" {
						t.Errorf("GET %s failed though the owner's connection serves: %v", id, err)
					}
				}
				if method == "POST" && n > 1 {
					t.Errorf("POST %s reached the upstream %d times", id, n)
				}
			}
			st := client.node.Stats()
			t.Logf("%s: served %d, failed %d, relay dials %d, upstream accepted %d", method, served, failed, st.RelayDials, accepted.Load())
			if st.RelayDials == 0 && accepted.Load() < 2 {
				t.Errorf("no paid dial happened: the test proves nothing")
			}
		})
	}
}
