package caddymodule

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"strconv"
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
		g := newWaitGuard(context.Background(), 20*time.Millisecond, func() { t.Error("ready on a timed-out wait") })
		select {
		case <-g.ctx.Done():
		case <-time.After(2 * time.Second):
			t.Fatal("the wait timeout did not end the context")
		}
		if !g.expired() || !errors.Is(context.Cause(g.ctx), errWaitTimeout) {
			t.Errorf("expired %v, cause %v", g.expired(), context.Cause(g.ctx))
		}
		if _, ok := g.ctx.Deadline(); ok {
			t.Error("the guarded context carries a deadline; it would travel to the owner")
		}
	})
	t.Run("disarmed by the request head", func(t *testing.T) {
		ready := 0
		g := newWaitGuard(context.Background(), 20*time.Millisecond, func() { ready++ })
		trace := httptrace.ContextClientTrace(g.ctx)
		trace.WroteHeaders()
		time.Sleep(60 * time.Millisecond)
		if g.ctx.Err() != nil || g.expired() {
			t.Fatal("the wait timeout fired after the request had its connection")
		}
		g.disarm()
		if ready != 1 {
			t.Errorf("ready ran %d times", ready)
		}
		g.cancel()
	})
	t.Run("stopped", func(t *testing.T) {
		g := newWaitGuard(context.Background(), 20*time.Millisecond, func() { t.Error("ready on a stopped wait") })
		g.stop()
		time.Sleep(60 * time.Millisecond)
		if g.ctx.Err() != nil {
			t.Fatal("a stopped guard fired")
		}
		g.cancel()
	})
	t.Run("parent composes", func(t *testing.T) {
		var got1xx bool
		parent := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{
			Got1xxResponse: func(int, textproto.MIMEHeader) error { got1xx = true; return nil },
		})
		g := newWaitGuard(parent, time.Second, nil)
		defer g.cancel()
		httptrace.ContextClientTrace(g.ctx).Got1xxResponse(103, nil)
		if !got1xx {
			t.Error("the request's own trace hooks were lost")
		}
	})
}

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

func TestWorkerConfig(t *testing.T) {
	in := `{"admin": {"listen": "localhost:2019", "origins": ["a"]}, "apps": {"http": {}}}`
	out, err := workerConfig([]byte(in), "/run/f/worker-1.sock", nil)
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		Admin struct {
			Listen  string   `json:"listen"`
			Origins []string `json:"origins"`
			Config  struct {
				Persist *bool `json:"persist"`
			} `json:"config"`
		} `json:"admin"`
		Apps map[string]any `json:"apps"`
	}
	if err := json.Unmarshal(out, &cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.Admin.Listen != "unix//run/f/worker-1.sock" || cfg.Admin.Config.Persist == nil || *cfg.Admin.Config.Persist ||
		len(cfg.Admin.Origins) != 1 || cfg.Apps["http"] == nil {
		t.Errorf("worker config: %s", out)
	}
	if _, err := workerConfig([]byte(`{"admin": {"disabled": true}}`), "/s", nil); err == nil {
		t.Error("a config with the admin endpoint off was accepted")
	}
}

// TestHandoffListener: of two listeners on one socket in a process, only
// the newer accepts; the older resumes if the newer closes first, and the
// socket outlives both.
func TestHandoffListener(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f, err := ln.(*net.TCPListener).File()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	addr := ln.Addr().String()
	ln.Close()
	key := "test/" + addr
	open := func() *handoffListener {
		l, err := net.FileListener(f)
		if err != nil {
			t.Fatal(err)
		}
		return newHandoffListener(key, l.(*net.TCPListener))
	}
	accepted := func(l *handoffListener) <-chan net.Conn {
		ch := make(chan net.Conn, 1)
		go func() {
			c, err := l.Accept()
			if err == nil {
				ch <- c
			}
			close(ch)
		}()
		return ch
	}
	dial := func() net.Conn {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}

	old := open()
	oldCh := accepted(old)
	time.Sleep(20 * time.Millisecond) // old is in Accept
	newer := open()
	newCh := accepted(newer)
	c1 := dial()
	defer c1.Close()
	select {
	case c := <-newCh:
		c.Close()
	case <-oldCh:
		t.Fatal("the older listener accepted after a newer one opened")
	case <-time.After(3 * time.Second):
		t.Fatal("nobody accepted")
	}
	// The newer one closes first (its config failed to start): the older
	// takes over, on the same socket.
	newer.Close()
	c2 := dial()
	defer c2.Close()
	select {
	case c, ok := <-oldCh:
		if !ok {
			t.Fatal("the older listener failed")
		}
		c.Close()
	case <-time.After(3 * time.Second):
		t.Fatal("the older listener did not resume")
	}
	old.Close()
	if _, err := old.Accept(); err == nil {
		t.Error("a closed listener accepted")
	}
	// The socket is still open: a third listener accepts a new connection.
	third := open()
	defer third.Close()
	ch := accepted(third)
	c3 := dial()
	defer c3.Close()
	select {
	case c := <-ch:
		c.Close()
	case <-time.After(3 * time.Second):
		t.Fatal("the socket did not survive its listeners")
	}
}

func TestFleetSocketsRewrite(t *testing.T) {
	port := strconv.Itoa(freePort(t))
	cfg := `{"apps": {"http": {"servers": {"a": {"listen": ["127.0.0.1:` + port + `", "unix//tmp/x.sock", "{env.ADDR}"]}}}}}`
	fs, err := openFleetSockets([]byte(cfg), 2)
	if err != nil {
		t.Fatal(err)
	}
	defer fs.close()
	if len(fs.files) != 2 || len(fs.files[0]) != 1 || len(fs.files[1]) != 1 || fs.fds["tcp/127.0.0.1:"+port] != 3 {
		t.Fatalf("sockets %v, %v", fs.fds, fs.files)
	}
	if fs.files[0][0].Fd() == fs.files[1][0].Fd() {
		t.Fatal("the two slots share one socket")
	}
	out, err := workerConfig([]byte(cfg), "/run/w.sock", fs)
	if err != nil {
		t.Fatal(err)
	}
	want := `"listen":["orbittcp/127.0.0.1:` + port + `","unix//tmp/x.sock","{env.ADDR}"]`
	if !strings.Contains(string(out), want) || !strings.Contains(string(out), `"shutdown_delay":"1s"`) {
		t.Errorf("worker config %s\nwant %s and a shutdown delay", out, want)
	}
	if !strings.Contains(fs.env(), `"tcp/127.0.0.1:`+port+`":3`) {
		t.Errorf("env %s", fs.env())
	}
	out, _ = workerConfig([]byte(`{"apps": {"http": {"shutdown_delay": "5s"}}}`), "/run/w.sock", fs)
	if !strings.Contains(string(out), `"shutdown_delay":"5s"`) {
		t.Errorf("the configuration's shutdown_delay was replaced: %s", out)
	}
}
