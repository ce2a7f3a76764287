package proxy

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"
)

// TestCancelAsExchangeEndsSparesNextExchange: a request's context is
// cancelled just as its response completes, and the abort that the
// cancellation starts lands only after the exchange has ended. The
// connection must not go back to the pool meanwhile: the late abort would
// tear down the next request on it, which would fail with the first
// request's error.
func TestCancelAsExchangeEndsSparesNextExchange(t *testing.T) {
	var reqs atomic.Int32
	got := make(chan int32, 2)
	answer1 := make(chan struct{})
	answer2 := make(chan struct{})
	stop := make(chan struct{})
	url := rawUpstream(t, func(c net.Conn, _ *bufio.Reader, _ *http.Request) bool {
		n := reqs.Add(1)
		got <- n
		wait := map[int32]chan struct{}{1: answer1, 2: answer2}[n]
		if wait != nil {
			select {
			case <-wait:
			case <-stop:
				return false
			}
		}
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		return true
	}) + "/"
	t.Cleanup(func() { close(stop) }) // before the upstream's own cleanup

	entered := make(chan struct{})
	release := make(chan struct{})
	aborted := make(chan struct{})
	abortOnCancel = func(c *conn, err error) {
		close(entered)
		<-release
		c.abort(err)
		close(aborted)
	}
	t.Cleanup(func() { abortOnCancel = (*conn).abort })

	tr := localTransport(t, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req1, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
	type result struct {
		resp *http.Response
		err  error
	}
	done1 := make(chan result, 1)
	go func() {
		resp, err := tr.RoundTrip(req1)
		done1 <- result{resp, err}
	}()
	<-got
	cancel()
	<-entered // the abort has begun and waits
	close(answer1)
	r1 := <-done1
	if r1.err != nil {
		t.Fatalf("first request, answered before its abort landed: %v", r1.err)
	}
	if b, err := io.ReadAll(r1.resp.Body); err != nil || string(b) != "ok" {
		t.Fatalf("first body %q, %v", b, err)
	}
	r1.resp.Body.Close()

	req2, _ := http.NewRequest("GET", url, nil)
	done2 := make(chan result, 1)
	go func() {
		resp, err := tr.RoundTrip(req2)
		done2 <- result{resp, err}
	}()
	select {
	case <-got:
	case r := <-done2:
		t.Fatalf("second request ended before the upstream saw it: %v", r.err)
	case <-time.After(5 * time.Second):
		t.Fatal("the upstream never saw the second request")
	}
	close(release) // the first request's abort lands now
	<-aborted
	close(answer2)
	r2 := <-done2
	if r2.err != nil {
		t.Fatalf("second request failed by the first one's cancellation: %v", r2.err)
	}
	defer r2.resp.Body.Close()
	if b, err := io.ReadAll(r2.resp.Body); err != nil || string(b) != "ok" {
		t.Fatalf("second body %q, %v", b, err)
	}
}
