package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"
)

// TestSmallBodyFreesTheConnectionAtOnce: with one connection allowed, a
// response whose small body came with its head leaves the connection free
// before the caller reads the body, so a second request is served while the
// first body is unread; both bodies then read in full, and not after Close,
// as net/http's do. A body larger than maxEarlyBody keeps the connection
// until it is read.
func TestSmallBodyFreesTheConnectionAtOnce(t *testing.T) {
	u := newTestUpstream(t)
	paths(t, func(tr *Transport) { tr.MaxConnsPerKey = 1 }, func(t *testing.T, rt http.RoundTripper, owner *member, _ func() http.RoundTripper) {
		warm(t, owner, u.url("/cl"))
		first, err := get(t, context.Background(), rt, u.url("/cl"))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		second, err := get(t, ctx, rt, u.url("/cl"))
		if err != nil {
			t.Fatalf("a second request while the first small body is unread: %v", err)
		}
		for _, resp := range []*http.Response{first, second} {
			if b, err := io.ReadAll(resp.Body); err != nil || string(b) != "hello world" {
				t.Errorf("body %q, %v; want hello world", b, err)
			}
			resp.Body.Close()
			if _, err := resp.Body.Read(make([]byte, 1)); err == nil || err.Error() != errReadOnClosedBody.Error() {
				t.Errorf("read after Close: %v, want %v", err, errReadOnClosedBody)
			}
		}
	})

	t.Run("large", func(t *testing.T) {
		tr := localTransport(t, func(tr *Transport) { tr.MaxConnsPerKey = 1 })
		big := u.url(fmt.Sprintf("/big?cl=1&n=%d", maxEarlyBody+1))
		first, err := get(t, context.Background(), tr, big)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		if resp, err := get(t, ctx, tr, big); !errors.Is(err, context.DeadlineExceeded) {
			if err == nil {
				resp.Body.Close()
			}
			t.Errorf("a second request while a body over maxEarlyBody is unread: %v, want it to wait for the connection", err)
		}
		if n, err := io.Copy(io.Discard, first.Body); err != nil || n != maxEarlyBody+1 {
			t.Errorf("large body: %d bytes, %v", n, err)
		}
		first.Body.Close()
	})
}
