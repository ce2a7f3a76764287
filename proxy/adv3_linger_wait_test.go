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

// TestAdv3LingerWaiterPaysForCancelledRequest: cap 1, an upstream that does
// not enforce any cap and whose handler, busy on a slow response, ignores
// its client's FIN (as any server mid-handler does). A client gives up on
// the slow response while a request waits for the connection's unit. The
// first time, the failed connection keeps the unit for closeWait, waiting
// for a close that never comes; for lingerPause after that the key's failed
// connections close at once, and the waiter is served as soon as the one
// ahead gives up. Lingering every time made each cancelled request cost the
// queue 250 ms. Once the pause is over, a failed connection waits for its
// upstream again.
func TestAdv3LingerWaiterPaysForCancelledRequest(t *testing.T) {
	lingerPause = 2 * time.Second
	t.Cleanup(func() { lingerPause = time.Minute })
	url := rawUpstream(t, func(c net.Conn, _ *bufio.Reader, req *http.Request) bool {
		if strings.HasPrefix(req.URL.Path, "/slow") {
			io.WriteString(c, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
			time.Sleep(5 * time.Second) // the handler, still busy; the FIN is not read
			return false
		}
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		return true
	})
	tr := localTransport(t, func(tr *Transport) { tr.MaxConnsPerKey = 1 })
	const afterPause = 3
	var pauseFrom time.Time
	for i := range afterPause + 1 {
		if i == afterPause {
			time.Sleep(time.Until(pauseFrom.Add(lingerPause + 100*time.Millisecond)))
		}
		req, _ := http.NewRequest("GET", url+"/slow", nil)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(resp.Body, make([]byte, 5)); err != nil {
			t.Fatal(err)
		}
		type res struct {
			err error
			d   time.Duration
		}
		got := make(chan res, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, "GET", url+"/", nil)
			start := time.Now()
			resp, err := tr.RoundTrip(req)
			if err == nil {
				drain(resp)
			}
			got <- res{err, time.Since(start)}
		}()
		time.Sleep(50 * time.Millisecond) // the second request waits for the unit
		closed := time.Now()
		resp.Body.Close() // the client went away
		r := <-got
		if r.err != nil {
			t.Fatalf("round %d: queued request: %v", i, r.err)
		}
		waited := time.Since(closed)
		if i == 0 {
			pauseFrom = time.Now()
		}
		lingered := i == 0 || i == afterPause
		limit := 150 * time.Millisecond
		if lingered {
			limit = closeWait + 500*time.Millisecond
		}
		if waited > limit {
			t.Errorf("round %d: queued request served %v after the connection ahead of it was given up", i, waited.Round(time.Millisecond))
		}
		if lingered && waited < closeWait*4/5 {
			t.Errorf("round %d: queued request served %v after the connection ahead of it was given up: it did not wait for the upstream", i, waited.Round(time.Millisecond))
		}
	}
}
