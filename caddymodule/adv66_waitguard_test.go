package caddymodule

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"runtime"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/orbitproxy/orbit/proxy"
)

// staleFire makes g's timer fire while g.mu is held, so that its fire
// goroutine is left waiting for the lock, as it is when the timer fires
// just as the request's head is written (WroteHeaders takes the lock
// first). With one P, that goroutine runs only once the caller blocks.
func staleFire(t *testing.T, g *waitGuard, d time.Duration) {
	t.Helper()
	g.mu.Lock()
	time.Sleep(d + 30*time.Millisecond)
	g.mu.Unlock()
}

// TestAdv66StaleFireUndoesARefusalsTimeout: the timer fires as the head
// goes to a sibling (fire waits for the lock), the sibling refuses the
// request past the wait timeout, and Retrying(true) ends the wait: the
// context's cause is errWaitTimeout. Then the stale fire runs, finds the
// guard disarmed and sets timedOut = false: expired() now says the wait
// timeout did not end the request, and classify no longer answers the
// wait-timeout 503 with Retry-After: reverse_proxy gets a dial error, which
// it retries (lb_try_*) or answers with 502.
func TestAdv66StaleFireUndoesARefusalsTimeout(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	const d = 10 * time.Millisecond
	g := newWaitGuard(context.Background(), d, nil, time.Now())
	defer g.cancel()
	staleFire(t, g, d)
	g.WroteHeaders() // the head reached the sibling
	g.Retrying(true) // which refused it, past the wait timeout
	before := g.expired()
	time.Sleep(20 * time.Millisecond) // the stale fire runs
	after := g.expired()
	if !before || !errors.Is(context.Cause(g.ctx), errWaitTimeout) {
		t.Fatalf("setup: Retrying(true) past the wait timeout: expired %v, cause %v", before, context.Cause(g.ctx))
	}
	if !after {
		t.Errorf("the context ended with %v, but expired() turned false once the stale fire ran", context.Cause(g.ctx))
	}
	// What the client gets: the retry loop's next attempt fails on the
	// cancelled context, and RoundTrip returns that (see proxy's RoundTrip).
	err := fmt.Errorf("%w: %w", context.Canceled, &proxy.Error{Op: "acquire", RetrySafe: true, Err: context.Canceled})
	vars := map[string]any{}
	req, _ := http.NewRequestWithContext(context.WithValue(context.Background(), caddyhttp.VarsCtxKey, vars), "GET", "http://upstream/", nil)
	tr := &Transport{wait: d}
	got := tr.classify(req, &upstreamInfo{name: "http://upstream:80"}, g, time.Time{}, err)
	var he caddyhttp.HandlerError
	if !errors.As(got, &he) || he.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("classify = %v (%T), want the wait timeout's 503; reverse_proxy retries a dial error (lb_try_*) or answers 502", got, got)
	}
}

// TestAdv66StaleFireEndsARetrysFreshWait: the same stale fire after a
// reused connection closed unanswered: Retrying(false) arms the guard for a
// whole new wait, and the stale fire, finding it armed, ended it at once.
func TestAdv66StaleFireEndsARetrysFreshWait(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	const d = 100 * time.Millisecond
	g := newWaitGuard(context.Background(), d, nil, time.Now())
	defer g.cancel()
	staleFire(t, g, d)
	g.WroteHeaders()
	g.Retrying(false) // a whole new wait of d
	armed := time.Now()
	time.Sleep(10 * time.Millisecond)
	if g.ctx.Err() != nil {
		t.Errorf("the retry's fresh %v wait ended %v after it began (cause %v)", d, time.Since(armed).Round(time.Millisecond), context.Cause(g.ctx))
	}
}

// TestAdv66RefusedWaitObservedAsServed: wait_duration_seconds is "the time
// a request took to get its upstream connection", and a timed-out wait is
// not observed as served (TestWaitGuard/fires). A head a sibling then
// refused did not give the request its connection: the wait went on, and
// the guard observed it at that first head.
func TestAdv66RefusedWaitObservedAsServed(t *testing.T) {
	t.Run("refused, then timed out", func(t *testing.T) {
		var waited countWaits
		g := newWaitGuard(context.Background(), 20*time.Millisecond, &waited, time.Now())
		defer g.cancel()
		g.WroteHeaders()
		time.Sleep(40 * time.Millisecond)
		g.Retrying(true)
		if !g.expired() {
			t.Fatal("setup: the refusal did not end the wait")
		}
		if g.end(false); waited.n != 0 {
			t.Errorf("a request refused with the wait timeout's 503 was observed %d times as served, after %gs", waited.n, waited.sum)
		}
	})
	t.Run("refused, then served", func(t *testing.T) {
		var waited countWaits
		start := time.Now()
		g := newWaitGuard(context.Background(), time.Second, &waited, start)
		defer g.cancel()
		g.WroteHeaders()
		time.Sleep(100 * time.Millisecond) // the sibling holds it, then refuses
		g.Retrying(true)
		served := time.Since(start)
		g.WroteHeaders() // the retry has its connection
		g.end(true)
		if waited.n != 1 || waited.sum < served.Seconds() {
			t.Errorf("observed %d waits summing %gs; the request had its connection after %gs", waited.n, waited.sum, served.Seconds())
		}
	})
}
