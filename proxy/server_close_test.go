package proxy

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestCloseRefusesExchangeNotSent: a sibling's POST has begun on the owner
// (its stream carries an exchange) but nothing of it has gone upstream when
// the owner closes. Close cancels the exchange, which says it sent nothing,
// and the sibling sends the POST on a connection of its own: served once,
// no error. Closed under the exchange, the stream would leave the sibling
// unable to tell whether the upstream saw the POST, which it must not send
// twice.
func TestCloseRefusesExchangeNotSent(t *testing.T) {
	var posts atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == "POST" {
			posts.Add(1)
		}
		io.Copy(io.Discard, r.Body)
		io.WriteString(w, "ok")
	}))
	t.Cleanup(up.Close)
	fleet := newFleet(t, 2, func(tr *Transport) { tr.MaxConnsPerKey = 1 })
	owner, client := fleet[0], fleet[1]
	warm(t, owner, up.URL)

	began := make(chan struct{})
	hook := func(ctx context.Context) {
		close(began)
		select {
		case <-ctx.Done(): // Close cancelled it
		case <-time.After(5 * time.Second):
		}
	}
	testHookExchanging.Store(&hook)
	t.Cleanup(func() { testHookExchanging.Store(nil) })

	type result struct {
		body string
		err  error
	}
	done := make(chan result, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "POST", up.URL+"/once", strings.NewReader("the body"))
		req.GetBody = nil // it cannot be sent again from the start
		resp, err := client.tr.RoundTrip(req)
		if err != nil {
			done <- result{err: err}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		done <- result{string(b), err}
	}()
	select {
	case <-began:
	case <-time.After(5 * time.Second):
		t.Fatal("the POST never began on the owner")
	}
	testHookExchanging.Store(nil)
	owner.node.Close()
	r := <-done
	if r.err != nil || r.body != "ok" {
		t.Fatalf("the POST that had sent nothing upstream when its owner closed: %q, %v; want it served", r.body, r.err)
	}
	if n := posts.Load(); n != 1 {
		t.Fatalf("the upstream saw the POST %d times, want 1", n)
	}
}
