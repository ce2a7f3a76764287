package proxy

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"runtime"
	"testing"
	"time"
)

// TestAdv3LingerConcurrentCloseUnblocksRead: a body Read blocked on the
// connection while another goroutine closes the body must return at once,
// as it does without a cap. Under a cap the abort only sets a deadline in
// the past, and the retirement's goroutine (closeAfterPeer) sets a fresh
// read deadline before the blocked reader has looked at it: the reader goes
// back to sleep on the socket and returns only when the drain gives up,
// closeWait later, or returns bytes read after Close.
func TestAdv3LingerConcurrentCloseUnblocksRead(t *testing.T) {
	for _, tc := range []struct {
		name string
		cap  int
	}{{"nocap", 0}, {"cap", 1}} {
		t.Run(tc.name, func(t *testing.T) {
			// One chunk, then nothing, and no close: the upstream reads our
			// FIN and ignores it, as a slow handler does.
			url := rawUpstream(t, func(c net.Conn, br *bufio.Reader, _ *http.Request) bool {
				io.WriteString(c, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
				io.Copy(io.Discard, br)
				return false
			})
			tr := localTransport(t, func(tr *Transport) { tr.MaxConnsPerKey = tc.cap })
			defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
			for i := range 5 {
				req, _ := http.NewRequestWithContext(context.Background(), "GET", url+"/", nil)
				resp, err := tr.RoundTrip(req)
				if err != nil {
					t.Fatal(err)
				}
				buf := make([]byte, 64)
				if _, err := io.ReadFull(resp.Body, buf[:5]); err != nil {
					t.Fatal(err)
				}
				type res struct {
					n   int
					err error
					at  time.Time
				}
				got := make(chan res, 1)
				go func() {
					n, err := resp.Body.Read(buf)
					got <- res{n, err, time.Now()}
				}()
				time.Sleep(30 * time.Millisecond) // the reader is blocked on the socket
				closed := time.Now()
				resp.Body.Close()
				select {
				case r := <-got:
					if d := r.at.Sub(closed); d > 100*time.Millisecond || r.n > 0 {
						t.Errorf("round %d: Read blocked during Close returned %d bytes, %v, %v after Close", i, r.n, r.err, d.Round(time.Millisecond))
					}
				case <-time.After(5 * time.Second):
					t.Fatalf("round %d: Read blocked during Close never returned", i)
				}
			}
		})
	}
}
