package caddymodule

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	"github.com/orbitproxy/orbit/backpressure"
	"github.com/orbitproxy/orbit/orbitpool"
	"github.com/orbitproxy/orbit/proxy"
)

// netTimeout is what a dial timeout looks like: it matches
// context.DeadlineExceeded, as the net package's timeouts do.
type netTimeout struct{}

func (netTimeout) Error() string        { return "i/o timeout" }
func (netTimeout) Timeout() bool        { return true }
func (netTimeout) Is(target error) bool { return target == context.DeadlineExceeded }

func TestClassify(t *testing.T) {
	tr := &Transport{wait: 300 * time.Millisecond}
	up := &upstreamInfo{name: "http://upstream:80"}
	expired := func() *waitGuard {
		g := &waitGuard{timedOut: true}
		return g
	}
	live := func() *waitGuard { return &waitGuard{} }
	request := func(ctx context.Context) *http.Request {
		vars := map[string]any{}
		ctx = context.WithValue(ctx, caddyhttp.VarsCtxKey, vars)
		r, _ := http.NewRequestWithContext(ctx, "GET", "http://upstream/", nil)
		return r
	}
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	past, cancel2 := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel2()

	for _, tc := range []struct {
		name       string
		ctx        context.Context
		guard      *waitGuard
		err        error
		status     int    // 0: not a HandlerError
		reason     string // of a refusal
		retryAfter string
		dial       bool
		is         error
		dl         time.Time // the transport's deadline for the request
		detail     string    // in the error's message, if set
	}{
		{name: "client went away", ctx: canceled, guard: live(),
			err: &proxy.Error{Op: "acquire", RetrySafe: true, Err: context.Canceled}, is: context.Canceled},
		{name: "request deadline passed", ctx: past, guard: live(),
			err: &proxy.Error{Op: "acquire", RetrySafe: true, Err: context.DeadlineExceeded}, status: 504, reason: "deadline_elapsed", is: backpressure.ErrDeadlineElapsed},
		{name: "pool wait timed out", ctx: context.Background(), guard: expired(),
			err:    &proxy.Error{Op: "acquire", RetrySafe: true, Err: &orbitpool.WaitError{Reason: orbitpool.ReasonBudget, Err: context.Canceled}},
			status: 503, reason: "budget", retryAfter: "1", is: proxy.ErrNoCapacity},
		{name: "permit wait timed out", ctx: context.Background(), guard: expired(),
			err: &proxy.Error{Op: "admit", RetrySafe: true, Err: context.Canceled}, status: 503, reason: "wait_timeout", retryAfter: "1", is: errWaitTimeout},
		{name: "budget wait timed out", ctx: context.Background(), guard: expired(),
			err: &proxy.Error{Op: "budget", RetrySafe: true, Err: context.Canceled}, status: 503, reason: "wait_timeout", retryAfter: "1", is: errWaitTimeout},
		{name: "wait spent at a busy owner", ctx: context.Background(), guard: expired(),
			err:    fmt.Errorf("%w: %w", context.Canceled, &proxy.Error{Op: "lease", RetrySafe: true, Err: fmt.Errorf("%w: %w: no worker", proxy.ErrLeaseRefused, proxy.ErrOwnerBusy)}),
			status: 503, reason: "owner_busy", retryAfter: "1", is: proxy.ErrOwnerBusy},
		{name: "wait spent at a leaving owner", ctx: context.Background(), guard: expired(),
			err:    fmt.Errorf("%w: %w", context.Canceled, &proxy.Error{Op: "lease", RetrySafe: true, Err: fmt.Errorf("%w: owner leaving", proxy.ErrLeaseRefused)}),
			status: 503, reason: "wait_timeout", retryAfter: "1", is: errWaitTimeout, detail: "the sibling it went to refused it"},
		{name: "saturated", ctx: context.Background(), guard: live(),
			err: &proxy.Error{Op: "admit", RetrySafe: true, Err: backpressure.ErrSaturated}, status: 503, reason: "saturated", retryAfter: "1", is: backpressure.ErrSaturated},
		{name: "pool wait ended near the deadline", ctx: context.Background(), guard: live(),
			err:    &proxy.Error{Op: "acquire", RetrySafe: true, Err: fmt.Errorf("%w: %w", backpressure.ErrDeadlineNear, &orbitpool.WaitError{Reason: orbitpool.ReasonBusy, Err: context.DeadlineExceeded})},
			status: 503, reason: "deadline_near", is: backpressure.ErrDeadlineNear},
		{name: "transport deadline passed in the exchange", ctx: context.Background(), guard: live(), dl: time.Now().Add(-time.Millisecond),
			err: &proxy.Error{Op: "read", Err: context.DeadlineExceeded}, status: 504, reason: "deadline_elapsed", is: backpressure.ErrDeadlineElapsed},
		{name: "deadline exceeded before the transport deadline is not a refusal", ctx: context.Background(), guard: live(), dl: time.Now().Add(time.Hour),
			err: &proxy.Error{Op: "read", Err: context.DeadlineExceeded}, is: context.DeadlineExceeded},
		{name: "dial not admitted", ctx: context.Background(), guard: live(),
			err: &proxy.Error{Op: "dial", RetrySafe: true, Err: proxy.ErrNotAdmitted}, status: 503, reason: "admission", retryAfter: "1", is: proxy.ErrNotAdmitted},
		{name: "owners busy", ctx: context.Background(), guard: live(),
			err:    &proxy.Error{Op: "lease", RetrySafe: true, Err: fmt.Errorf("%w: %w: no worker", proxy.ErrLeaseRefused, proxy.ErrOwnerBusy)},
			status: 503, reason: "owner_busy", retryAfter: "1", is: proxy.ErrOwnerBusy},
		{name: "table full for a capped upstream", ctx: context.Background(), guard: live(),
			err:    &proxy.Error{Op: "acquire", RetrySafe: true, Err: fmt.Errorf("orbitpool: all 1024 resource slots of lane 0 are in use: %w", orbitpool.ErrFull)},
			status: 503, reason: "table_full", retryAfter: "1", is: orbitpool.ErrFull, detail: "raise the orbit_pool app's conns_per_process or keys"},
		{name: "wait for room in the full table timed out", ctx: context.Background(), guard: expired(),
			err:    &proxy.Error{Op: "acquire", RetrySafe: true, Err: fmt.Errorf("%w: orbitpool: all 1024 resource slots of lane 0 are in use: %w", proxy.ErrNoCapacity, orbitpool.ErrFull)},
			status: 503, reason: "table_full", retryAfter: "1", is: orbitpool.ErrFull, detail: "no connection free within"},
		{name: "drained", ctx: context.Background(), guard: live(),
			err: &proxy.Error{Op: "admit", RetrySafe: true, Err: backpressure.ErrQuotaExceeded}, status: 503, reason: "draining", retryAfter: "1", is: backpressure.ErrQuotaExceeded},
		{name: "deadline near", ctx: context.Background(), guard: live(),
			err: &proxy.Error{Op: "admit", RetrySafe: true, Err: backpressure.ErrDeadlineNear}, status: 503, reason: "deadline_near", is: backpressure.ErrDeadlineNear},
		{name: "policy refused", ctx: context.Background(), guard: live(),
			err: &proxy.Error{Op: "acquire", RetrySafe: true, Err: &orbitpool.RefusedError{Reason: orbitpool.ReasonPolicy}}, status: 503, reason: "policy", retryAfter: "1", is: orbitpool.ErrRefused},
		{name: "dial timeout is a dial error, not a 504", ctx: context.Background(), guard: live(),
			err: &proxy.Error{Op: "dial", RetrySafe: true, Err: &net.OpError{Op: "dial", Net: "tcp", Err: netTimeout{}}}, dial: true},
		{name: "lease refused", ctx: context.Background(), guard: live(),
			err: &proxy.Error{Op: "lease", RetrySafe: true, Err: proxy.ErrLeaseRefused}, dial: true},
		{name: "response header timeout", ctx: context.Background(), guard: live(),
			err: &proxy.Error{Op: "read", Err: proxy.ErrResponseHeaderTimeout}, status: 504, is: proxy.ErrResponseHeaderTimeout},
		{name: "broken after sending", ctx: context.Background(), guard: live(),
			err: &proxy.Error{Op: "read", Err: proxy.ErrConnBroken}, is: proxy.ErrConnBroken},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := request(tc.ctx)
			got := tr.classify(req, up, tc.guard, tc.dl, tc.err)
			if tc.is != nil && !errors.Is(got, tc.is) {
				t.Errorf("%v does not match %v", got, tc.is)
			}
			if tc.detail != "" && !strings.Contains(got.Error(), tc.detail) {
				t.Errorf("%q does not say %q", got.Error(), tc.detail)
			}
			var de reverseproxy.DialError
			if isDial := errors.As(got, &de); isDial != tc.dial {
				t.Errorf("dial error: %v, want %v (%v)", isDial, tc.dial, got)
			}
			var he caddyhttp.HandlerError
			isHE := errors.As(got, &he)
			if (tc.status != 0) != isHE || (isHE && he.StatusCode != tc.status) {
				t.Fatalf("got %#v, want status %d", got, tc.status)
			}
			if tc.reason == "" {
				return
			}
			var re *RefusalError
			if !errors.As(got, &re) || re.Reason != tc.reason {
				t.Fatalf("refusal %#v, want reason %q", re, tc.reason)
			}
			if errors.Is(got, context.Canceled) {
				t.Error("a refusal matches context.Canceled: reverse_proxy would take it for the client going away")
			}
			if v, _ := caddyhttp.GetVar(req.Context(), VarRetryAfter).(string); v != tc.retryAfter {
				t.Errorf("retry after var %q, want %q", v, tc.retryAfter)
			}
			if v, _ := caddyhttp.GetVar(req.Context(), VarRefusal).(string); v != tc.reason {
				t.Errorf("refusal var %q, want %q", v, tc.reason)
			}
		})
	}
}

func TestWaitGuard(t *testing.T) {
	t.Run("fires", func(t *testing.T) {
		var waited countWaits
		g := newWaitGuard(context.Background(), 20*time.Millisecond, &waited, time.Now())
		select {
		case <-g.ctx.Done():
		case <-time.After(2 * time.Second):
			t.Fatal("the wait timeout did not end the context")
		}
		if !g.expired() || !errors.Is(context.Cause(g.ctx), errWaitTimeout) {
			t.Errorf("expired %v, cause %v", g.expired(), context.Cause(g.ctx))
		}
		if g.end(true); waited.n != 0 {
			t.Error("a timed-out wait was observed as served")
		}
		if _, ok := g.ctx.Deadline(); ok {
			t.Error("the guarded context carries a deadline; it would travel to the owner")
		}
	})
	t.Run("disarmed by the request head", func(t *testing.T) {
		// The proxy tells the guard once the head is out
		// (TestWroteHeadersOnEveryPath in proxy).
		var waited countWaits
		start := time.Now()
		g := newWaitGuard(context.Background(), 20*time.Millisecond, &waited, start)
		g.WroteHeaders()
		head := time.Since(start)
		time.Sleep(60 * time.Millisecond)
		if g.ctx.Err() != nil || g.expired() {
			t.Fatal("the wait timeout fired after the request had its connection")
		}
		if waited.n != 0 {
			t.Error("the wait was observed before the round trip was over: a sibling may still refuse it")
		}
		g.end(true) // the round trip returns
		g.end(true)
		if waited.n != 1 {
			t.Errorf("the wait was observed %d times", waited.n)
		}
		if waited.sum <= 0 || waited.sum > head.Seconds() {
			t.Errorf("observed a wait of %gs, want more than 0 and at most the %gs to the head", waited.sum, head.Seconds())
		}
		g.cancel()
	})
	t.Run("a sibling's wait for a worker", func(t *testing.T) {
		// The proxy tells the guard how long the sibling that owns the
		// connection waited for a worker, with its accept
		// (TestOwnersWaitForAWorkerIsTheKeysWait in proxy): the wait ends
		// that much later, and never later than now.
		var waited countWaits
		start := time.Now()
		g := newWaitGuard(context.Background(), time.Second, &waited, start)
		defer g.cancel()
		g.OwnerWaited(time.Hour) // before the head: its time will have the wait in it
		time.Sleep(30 * time.Millisecond)
		head := time.Since(start)
		g.WroteHeaders()
		time.Sleep(30 * time.Millisecond)
		g.OwnerWaited(20 * time.Millisecond)
		g.end(true)
		if want := head + 20*time.Millisecond; waited.n != 1 || waited.sum < want.Seconds() || waited.sum > time.Since(start).Seconds() {
			t.Errorf("observed %d waits, %gs; want one of at least %gs, and at most the round trip's", waited.n, waited.sum, want.Seconds())
		}

		waited = countWaits{}
		start = time.Now()
		g = newWaitGuard(context.Background(), time.Second, &waited, start)
		defer g.cancel()
		g.WroteHeaders()
		g.OwnerWaited(time.Hour)
		g.end(true)
		if elapsed := time.Since(start); waited.n != 1 || waited.sum > elapsed.Seconds() {
			t.Errorf("observed %d waits, %gs, after a sibling said it waited an hour; want one of at most the round trip's %gs", waited.n, waited.sum, elapsed.Seconds())
		}

		// A retry after the request had its connection (a reused one
		// that closed unanswered) waits anew, but the request's wait
		// ended with the first head: a sibling's wait on the retry does
		// not move it.
		waited = countWaits{}
		start = time.Now()
		g = newWaitGuard(context.Background(), time.Second, &waited, start)
		defer g.cancel()
		g.WroteHeaders()
		first := time.Since(start)
		g.Retrying(false)
		time.Sleep(30 * time.Millisecond)
		g.WroteHeaders()
		g.OwnerWaited(20 * time.Millisecond)
		g.end(true)
		if waited.n != 1 || waited.sum > first.Seconds() {
			t.Errorf("observed %d waits, %gs; want one of the first head's %gs, which the retry's sibling's wait does not move", waited.n, waited.sum, first.Seconds())
		}
	})
	t.Run("armed again for a retry", func(t *testing.T) {
		// The proxy tells the guard before it sends a request again after
		// an attempt that had its head out (a sibling that refused it):
		// the retry's wait is bounded too
		// (TestRetryAfterAnOwnersRefusalWaitsAgain in proxy).
		var waited countWaits
		g := newWaitGuard(context.Background(), 20*time.Millisecond, &waited, time.Now())
		g.WroteHeaders()
		time.Sleep(40 * time.Millisecond)
		g.Retrying(false)
		select {
		case <-g.ctx.Done():
		case <-time.After(2 * time.Second):
			t.Fatal("the wait timeout did not end the retry's wait")
		}
		if !g.expired() || !errors.Is(context.Cause(g.ctx), errWaitTimeout) {
			t.Errorf("expired %v, cause %v", g.expired(), context.Cause(g.ctx))
		}
		if g.end(false); waited.n != 0 {
			t.Errorf("a request the wait timeout ended was observed %d times as served", waited.n)
		}
	})
	t.Run("a retry before any connection keeps the first bound", func(t *testing.T) {
		start := time.Now()
		g := newWaitGuard(context.Background(), 200*time.Millisecond, nil, start)
		time.Sleep(150 * time.Millisecond)
		g.Retrying(false) // a failed dial: the guard is still armed
		select {
		case <-g.ctx.Done():
		case <-time.After(2 * time.Second):
			t.Fatal("the wait timeout did not end the wait")
		}
		// Armed anew, it would have fired 350 ms in at the earliest.
		if d := time.Since(start); d >= 340*time.Millisecond {
			t.Errorf("the wait ended %v in; a retry before any connection restarted the wait timeout", d)
		}
	})
	t.Run("what is left of the wait", func(t *testing.T) {
		// For a sibling's wait for a worker
		// (TestOwnerWaitsNoLongerThanTheCaller in proxy).
		g := newWaitGuard(context.Background(), time.Second, nil, time.Now().Add(-300*time.Millisecond))
		defer g.cancel()
		if left := g.WaitLeft(); left <= 0 || left > 700*time.Millisecond {
			t.Errorf("armed 300ms ago for 1s: %v left, want at most 700ms", left)
		}
		g.WroteHeaders()
		if left := g.WaitLeft(); left != 0 {
			t.Errorf("disarmed: %v left, want 0 (no bound)", left)
		}
		late := newWaitGuard(context.Background(), time.Second, nil, time.Now().Add(-2*time.Second))
		defer late.cancel()
		if left := late.WaitLeft(); left <= 0 || left > time.Millisecond {
			t.Errorf("armed past its timeout: %v left, want a bound at once", left)
		}
		if left := newWaitGuard(context.Background(), 0, nil, time.Now()).WaitLeft(); left != 0 {
			t.Errorf("no wait timeout: %v left, want 0", left)
		}
	})
	t.Run("a refused attempt's time counts as waiting", func(t *testing.T) {
		// The head went to a sibling, which held it and refused it as
		// busy (TestRetryAfterAnOwnersRefusalWaitsAgain in proxy): that
		// was a wait, past the wait timeout by now.
		var waited countWaits
		g := newWaitGuard(context.Background(), 20*time.Millisecond, &waited, time.Now())
		g.WroteHeaders()
		time.Sleep(40 * time.Millisecond)
		g.Retrying(true)
		if !g.expired() || !errors.Is(context.Cause(g.ctx), errWaitTimeout) {
			t.Errorf("after a refusal past the wait timeout: expired %v, cause %v; want the wait over at once", g.expired(), context.Cause(g.ctx))
		}
	})
	t.Run("a refusal counts from the last whole wait", func(t *testing.T) {
		// A reused connection that closed unanswered gave the retry a
		// whole wait; a refusal after that counts from its start.
		g := newWaitGuard(context.Background(), time.Second, nil, time.Now().Add(-time.Hour))
		g.WroteHeaders()
		g.Retrying(false)
		g.WroteHeaders()
		g.Retrying(true)
		if g.expired() || g.ctx.Err() != nil {
			t.Fatal("a refusal right after a whole wait began ended the wait")
		}
		select {
		case <-g.ctx.Done():
		case <-time.After(5 * time.Second):
			t.Fatal("the wait timeout did not end the refused retry's wait")
		}
		if !g.expired() {
			t.Error("the refused retry's wait ended, not by the wait timeout")
		}
	})
	t.Run("no wait timeout: a refused head is no connection", func(t *testing.T) {
		var waited countWaits
		start := time.Now()
		g := newWaitGuard(context.Background(), 0, &waited, start)
		defer g.cancel()
		g.WroteHeaders()
		time.Sleep(20 * time.Millisecond) // the sibling holds it, then refuses
		g.Retrying(true)
		served := time.Since(start)
		g.WroteHeaders()
		g.end(true)
		if waited.n != 1 || waited.sum < served.Seconds() {
			t.Errorf("observed %d waits summing %gs; the request had its connection after %gs", waited.n, waited.sum, served.Seconds())
		}
	})
	t.Run("ended without a connection", func(t *testing.T) {
		var waited countWaits
		g := newWaitGuard(context.Background(), 20*time.Millisecond, &waited, time.Now())
		g.end(false)
		time.Sleep(60 * time.Millisecond)
		if g.ctx.Err() != nil {
			t.Fatal("an ended guard fired")
		}
		if g.end(true); waited.n != 0 {
			t.Error("a wait that ended without a connection was observed as served")
		}
		g.cancel()
	})
	t.Run("parent composes", func(t *testing.T) {
		var got1xx bool
		parent := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{
			Got1xxResponse: func(int, textproto.MIMEHeader) error { got1xx = true; return nil },
		})
		g := newWaitGuard(parent, time.Second, nil, time.Now())
		defer g.cancel()
		httptrace.ContextClientTrace(g.ctx).Got1xxResponse(103, nil)
		if !got1xx {
			t.Error("the request's own trace hooks were lost")
		}
	})
}

// countWaits is a waitObserver that counts and sums what it observes.
type countWaits struct {
	n   int
	sum float64
}

func (c *countWaits) Observe(v float64) { c.n++; c.sum += v }

func TestTrackBody(t *testing.T) {
	done := 0
	b := trackBody(io.NopCloser(strings.NewReader("x")), func() { done++ })
	if _, ok := b.(io.ReadWriteCloser); ok {
		t.Error("a plain body became writable")
	}
	b.Close()
	b.Close()
	if done != 1 {
		t.Errorf("done ran %d times", done)
	}

	c1, c2 := net.Pipe()
	defer c2.Close()
	done = 0
	b = trackBody(c1, func() { done++ })
	if _, ok := b.(io.ReadWriteCloser); !ok {
		t.Fatal("an upgraded connection's body lost Write")
	}
	if _, ok := b.(interface{ CloseWrite() error }); ok {
		t.Error("a body without CloseWrite gained one")
	}
	b.Close()

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	tc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	b = trackBody(tc, func() { done++ })
	if _, ok := b.(interface{ CloseWrite() error }); !ok {
		t.Error("an upgraded TCP connection's body lost CloseWrite")
	}
	b.Close()
	if done != 2 {
		t.Errorf("done ran %d times over two bodies", done)
	}
}

// TestKeyNamesShared: a name one member records is read by another that
// never proxied to the upstream; what is not a name (an overlong or
// unprintable line, or a partial last line) is not read.
func TestKeyNamesShared(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "names")
	a, err := openKeyNames(dir)
	if err != nil {
		t.Fatal(err)
	}
	b, err := openKeyNames(dir)
	if err != nil {
		t.Fatal(err)
	}
	k := orbitpool.Key{Hi: 1, Lo: 2}
	for range 2 {
		if err := a.add(k, "http://up:80"); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.add(k, "http://up.example:80"); err != nil {
		t.Fatal(err)
	}
	want := []string{"http://up.example:80", "http://up:80"}
	if got := b.of(k); !slices.Equal(got, want) {
		t.Errorf("names of %v: %q, want %q", k, got, want)
	}
	if got := b.of(orbitpool.Key{Hi: 1}); len(got) != 0 {
		t.Errorf("a key nobody named has names %q", got)
	}
	if st, err := os.Stat(dir); err != nil || st.Mode().Perm() != 0o700 {
		t.Errorf("names directory: %v, %v", st, err)
	}
	f, err := os.OpenFile(a.path(k), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString(strings.Repeat("x", maxName+1) + "\n" + "bad\x00name\n" + "http://partial")
	f.Close()
	c, _ := openKeyNames(dir)
	if got := c.of(k); !slices.Equal(got, want) {
		t.Errorf("names with malformed lines in the file: %q, want %q", got, want)
	}
	if err := a.remove(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("names directory after remove: %v", err)
	}
}
