package proxy

import (
	"context"
	"errors"
	"io"
	"net/http"
	"testing"
	"time"

	"go.uber.org/zap/zaptest/observer"
)

// TestAdv10PanickingProbedBodyFailsOnlyItsExchange: a GET whose body has no
// declared length is probed by net/http's Request.Write in a goroutine of its
// own, which recovers nothing: a body whose Read panics there must fail that
// exchange (logged once with its stack), as it does when orbit's request
// writer reads it, not end the process; locally and through a sibling. The
// next request is served.
func TestAdv10PanickingProbedBodyFailsOnlyItsExchange(t *testing.T) {
	u := newTestUpstream(t)
	one := func(tr *Transport) { tr.MaxConnsPerKey = 1 }
	loggedPaths(t, one, func(t *testing.T, rt http.RoundTripper, owner *member, logs *observer.ObservedLogs) {
		warm(t, owner, u.url("/cl"))
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", u.url("/echo"), io.MultiReader(panicBody{}))
		resp, err := rt.RoundTrip(req)
		if err == nil {
			resp.Body.Close()
			t.Fatal("a request whose body panicked succeeded")
		}
		if !errors.Is(err, errPanic) {
			t.Errorf("error %v, want the recovered panic", err)
		}
		if rt == owner.tr {
			// The caller's process logs it; the local path's is observed.
			checkPanicLogged(t, logs, "panicBody.Read")
		}
		resp, err = get(t, ctx, rt, u.url("/cl"))
		if err != nil {
			t.Fatalf("next request: %v", err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(b) != "hello world" {
			t.Fatalf("next request got %q", b)
		}
	})
}
