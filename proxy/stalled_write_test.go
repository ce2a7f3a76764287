package proxy

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"
)

// stallingBody gives one byte, then blocks until stall has passed or the
// body is closed.
type stallingBody struct {
	stall time.Duration
	once  sync.Once
	sent  bool
	done  chan struct{}
}

func (b *stallingBody) Read(p []byte) (int, error) {
	if !b.sent {
		b.sent = true
		p[0] = 'x'
		return 1, nil
	}
	select {
	case <-time.After(b.stall):
	case <-b.done:
	}
	return 0, io.EOF
}

func (b *stallingBody) Close() error {
	b.once.Do(func() { close(b.done) })
	return nil
}

// earlyRefusalUpstream answers a POST 401 at once, on a connection it keeps
// open and reads on, and a GET 200.
func earlyRefusalUpstream(t *testing.T) string {
	return rawUpstream(t, func(c net.Conn, br *bufio.Reader, req *http.Request) bool {
		if req.Method == "POST" {
			io.WriteString(c, "HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\n\r\n")
			// What follows is the body's chunks, not a request.
			io.Copy(io.Discard, br)
			return false
		}
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		return true
	})
}

// An upstream that answers before it has the body (a 401, here on a
// connection it keeps open) ends the exchange; a body that then stalls costs
// the connection after maxWriteWait, as net/http's does, and its unit of the
// key's budget with it: the next request to the key does not wait for the
// stalled body's writer.
func TestStalledBodyAfterEarlyAnswerFreesConnSlot(t *testing.T) {
	const stall = 2 * time.Second
	url := earlyRefusalUpstream(t)
	m := newFleet(t, 1, func(tr *Transport) { tr.MaxConnsPerKey = 1 })[0]
	ref := &http.Transport{MaxConnsPerHost: 1}
	defer ref.CloseIdleConnections()
	for _, c := range []struct {
		name string
		rt   http.RoundTripper
	}{{"net/http", ref}, {"orbit", m.tr}} {
		body := &stallingBody{stall: stall, done: make(chan struct{})}
		req, _ := http.NewRequest("POST", url+"/upload", body)
		resp, err := c.rt.RoundTrip(req)
		if err != nil {
			t.Fatalf("%s: POST: %v", c.name, err)
		}
		drain(resp)
		if resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("%s: POST: status %d, want 401", c.name, resp.StatusCode)
		}
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), stall/2)
		req, _ = http.NewRequestWithContext(ctx, "GET", url+"/", nil)
		resp, err = c.rt.RoundTrip(req)
		if err != nil {
			cancel()
			body.Close()
			t.Fatalf("%s: GET after the POST's early answer: %v after %v; want a connection once the stalled write is given up (%v), not after the body's %v stall",
				c.name, err, time.Since(start).Round(time.Millisecond), maxWriteWait, stall)
		}
		drain(resp)
		cancel()
		body.Close()
	}
}
