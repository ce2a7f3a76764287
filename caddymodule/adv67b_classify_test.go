package caddymodule

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/orbitproxy/orbit/proxy"
)

// TestAdv67bSpentWaitRefusalIsNoClientCancel: the proxy returns a refusal
// that spent the wait behind the context's error (context.Canceled, the
// guard's cancel), for a busy owner, a leaving one, a stale lease or a gone
// connection. Whatever the refusal, the error reverse_proxy gets is a 503
// that does not match context.Canceled (which reverse_proxy takes for a
// client that went away, status 499, and no retry), nor the refusal's
// wrapped context error through any path.
func TestAdv67bSpentWaitRefusalIsNoClientCancel(t *testing.T) {
	tr := &Transport{wait: 300 * time.Millisecond}
	up := &upstreamInfo{name: "http://upstream:80"}
	for name, inner := range map[string]error{
		"busy":    fmt.Errorf("%w: %w: no worker", proxy.ErrLeaseRefused, proxy.ErrOwnerBusy),
		"leaving": fmt.Errorf("%w: owner leaving", proxy.ErrLeaseRefused),
		"stale":   fmt.Errorf("%w: stale", proxy.ErrLeaseRefused),
		"dial":    errors.New("connection refused"),
	} {
		t.Run(name, func(t *testing.T) {
			g := newWaitGuard(context.Background(), time.Millisecond, nil, time.Now())
			select {
			case <-g.ctx.Done(): // the timer fired
			case <-time.After(2 * time.Second):
				t.Fatal("setup: the wait timeout did not fire")
			}
			g.Retrying(true)
			if g.ctx.Err() == nil || !g.expired() {
				t.Fatalf("setup: guard not expired (%v, %v)", g.ctx.Err(), g.expired())
			}
			err := fmt.Errorf("%w: %w", g.ctx.Err(), &proxy.Error{Op: "lease", RetrySafe: true, Err: inner})
			vars := map[string]any{}
			ctx := context.WithValue(context.Background(), caddyhttp.VarsCtxKey, vars)
			req, _ := http.NewRequestWithContext(ctx, "GET", "http://upstream/", nil)
			got := tr.classify(req, up, g, time.Time{}, err)
			g.end(false)
			g.cancel()
			if errors.Is(got, context.Canceled) || errors.Is(got, context.DeadlineExceeded) {
				t.Errorf("%v matches a context error: reverse_proxy would take it for the client's cancellation", got)
			}
			var he caddyhttp.HandlerError
			if !errors.As(got, &he) || he.StatusCode != http.StatusServiceUnavailable {
				t.Errorf("%#v, want a 503 HandlerError", got)
			}
			if r, _ := vars[VarRefusal].(string); r == "" {
				t.Errorf("no refusal reason set: %v", vars)
			}
		})
	}
}
