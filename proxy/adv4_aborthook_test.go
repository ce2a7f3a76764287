package proxy

import (
	"bufio"
	"context"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"
)

// TestAdv4AbortHookOnlyForLaterExchanges: abortOnCancel is a process-wide
// test hook. A test that installs it must see only the exchanges it starts
// afterwards, not one an earlier test left watching its context (whose
// cancellation may fire at any later time, a timeout's included): such a
// call would run the hook of another test, which closes its channels once
// (a second call panics the test binary) and blocks until that test
// releases it, and reads the variable concurrently with the test writing
// it. So the hook must be taken when the exchange begins to watch its
// context, not when the context ends.
func TestAdv4AbortHookOnlyForLaterExchanges(t *testing.T) {
	got := make(chan struct{}, 1)
	stop := make(chan struct{})
	url := rawUpstream(t, func(c net.Conn, _ *bufio.Reader, _ *http.Request) bool {
		got <- struct{}{}
		<-stop // never answers; the request is cancelled
		return false
	}) + "/"
	t.Cleanup(func() { close(stop) })
	tr := localTransport(t, nil)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
	done := make(chan error, 1)
	go func() {
		resp, err := tr.RoundTrip(req)
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	select {
	case <-got:
	case <-time.After(5 * time.Second):
		t.Fatal("the upstream never saw the request")
	}

	// Another test's hook, installed while this exchange is under way.
	var calls atomic.Int32
	abortOnCancel = func(c *conn, err error) {
		calls.Add(1)
		c.abort(err)
	}
	t.Cleanup(func() { abortOnCancel = (*conn).abort })

	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the cancelled request did not end")
	}
	if n := calls.Load(); n != 0 {
		t.Errorf("a hook installed after the exchange began ran %d time(s) for it", n)
	}
}
