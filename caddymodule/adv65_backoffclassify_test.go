package caddymodule

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	"github.com/orbitproxy/orbit/backpressure"
	"github.com/orbitproxy/orbit/proxy"
)

// What proxy.Transport returns when the request's context ends while it
// backs off after an upstream went away (awayBackoff): the context's error
// wrapped around the attempt's, which is retry-safe. The transport's
// deadline passing must be a 504 (deadline_elapsed), not a dial error that
// reverse_proxy would retry; the client going away context.Canceled as is.
func TestAdv65ClassifyContextEndedInBackoff(t *testing.T) {
	tr := &Transport{wait: 300 * time.Millisecond}
	up := &upstreamInfo{name: "http://upstream:80"}
	gone := &proxy.Error{Op: "roundtrip", RetrySafe: true, Err: fmt.Errorf("%w: http2: Transport received Server's graceful shutdown GOAWAY", proxy.ErrConnBroken)}
	request := func(ctx context.Context) *http.Request {
		ctx = context.WithValue(ctx, caddyhttp.VarsCtxKey, map[string]any{})
		r, _ := http.NewRequestWithContext(ctx, "GET", "http://upstream/", nil)
		return r
	}

	// The transport's deadline (on the context it gave proxy, not req's).
	got := tr.classify(request(context.Background()), up, &waitGuard{}, time.Now().Add(-time.Millisecond),
		fmt.Errorf("%w: %w", context.DeadlineExceeded, gone))
	var he caddyhttp.HandlerError
	var de reverseproxy.DialError
	if errors.As(got, &de) || !errors.As(got, &he) || he.StatusCode != 504 || !errors.Is(got, backpressure.ErrDeadlineElapsed) {
		t.Errorf("deadline in the backoff: %#v; want a 504 deadline_elapsed refusal", got)
	}

	// The client went away.
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	got = tr.classify(request(canceled), up, &waitGuard{}, time.Time{}, fmt.Errorf("%w: %w", context.Canceled, gone))
	if !errors.Is(got, context.Canceled) || errors.As(got, &de) {
		t.Errorf("client gone in the backoff: %#v; want context.Canceled, not a dial error", got)
	}
}
