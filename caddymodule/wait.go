package caddymodule

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/orbitproxy/orbit/proxy"
)

// errWaitTimeout is the cause of a request context ended by its wait
// timeout.
var errWaitTimeout = errors.New("orbit_pool: wait timeout")

// waitGuard bounds how long one request may wait for its turn (a
// back-pressure permit) and its connection (from the pool), without bounding
// the exchange that follows: a streamed response or a WebSocket may outlive
// the wait timeout by hours.
//
// The request goes to the proxy with a context that is cancelled when the
// wait timeout fires, unless the guard was disarmed first. It is disarmed
// once the request head is written (so the request has its connection), and
// at the latest when the round trip returns. The guard adds no deadline of
// its own: a deadline travels with the request to a sibling that forwards it
// and bounds the whole exchange there, which the wait timeout must not. The
// request's own deadline, when it has one (see Transport.deadline), is on
// the parent context and does exactly that.
//
// The proxy tells the guard when the head is written, and when it sends the
// request again after a failed attempt, which waits for a connection again:
// the guard is its proxy.WaitWatcher, and is armed again for that wait. An
// attempt a sibling refused (busy, leaving) was a wait too, from the guard's
// last arming on, so the retry gets what is left of that wait; after any
// other (a reused connection that closed before answering), a whole one.
//
// Every request through the transport makes one, so it holds what it needs
// itself (what it observes) rather than in closures: each is an allocation
// per request.
type waitGuard struct {
	ctx         context.Context
	cancelCause context.CancelCauseFunc
	waited      waitObserver // observes the first wait once it is over, if set
	start       time.Time
	d           time.Duration

	mu       sync.Mutex
	timer    *time.Timer
	armedAt  time.Time // when the current wait began
	armed    bool
	timedOut bool
	observed bool
}

// newWaitGuard returns a guard over a context derived from parent. waited,
// if set, observes the time since start when the request first has its
// connection.
func newWaitGuard(parent context.Context, d time.Duration, waited waitObserver, start time.Time) *waitGuard {
	g := &waitGuard{armed: true, armedAt: start, waited: waited, start: start, d: d}
	g.ctx, g.cancelCause = context.WithCancelCause(parent)
	g.ctx = proxy.WithWaitWatcher(g.ctx, g)
	if d > 0 {
		g.mu.Lock()
		g.timer = time.AfterFunc(d, g.fire)
		g.mu.Unlock()
	}
	return g
}

// fire ends the wait: the timeout passed before the request had its
// connection.
func (g *waitGuard) fire() {
	g.mu.Lock()
	fire := g.armed
	g.armed = false
	g.timedOut = fire
	g.mu.Unlock()
	if fire {
		g.cancelCause(errWaitTimeout)
	}
}

// disarm stops the wait timeout: the request has its connection.
func (g *waitGuard) disarm() {
	g.mu.Lock()
	if !g.armed {
		g.mu.Unlock()
		return
	}
	g.armed = false
	if g.timer != nil {
		g.timer.Stop()
	}
	observe := !g.observed && g.waited != nil
	g.observed = true
	g.mu.Unlock()
	if observe {
		g.waited.Observe(time.Since(g.start).Seconds())
	}
}

// WroteHeaders disarms the guard: the request has its connection.
func (g *waitGuard) WroteHeaders() { g.disarm() }

// Retrying arms a disarmed guard again: the proxy is about to send the
// request again, and the retry waits for a connection. After a sibling's
// refusal the wait that the head's writing seemed to end went on, and the
// guard keeps its bound, firing at once if it has passed; otherwise the
// retry waits for the wait timeout anew. A guard still armed keeps its
// timer, so retries before any connection (failed dials) share the first
// wait's bound.
func (g *waitGuard) Retrying(refused bool) {
	g.mu.Lock()
	if g.armed || g.timedOut || g.timer == nil {
		g.mu.Unlock()
		return
	}
	left := g.d
	if now := time.Now(); refused {
		left -= now.Sub(g.armedAt)
	} else {
		g.armedAt = now
	}
	if left > 0 {
		g.armed = true
		g.timer.Reset(left)
		g.mu.Unlock()
		return
	}
	g.timedOut = true
	g.mu.Unlock()
	g.cancelCause(errWaitTimeout)
}

// WaitLeft is what is left of the wait timeout while the guard is armed,
// for a sibling that owns the request's connection to wait for a worker no
// longer; 0 (no bound) otherwise.
func (g *waitGuard) WaitLeft() time.Duration {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.armed || g.timer == nil {
		return 0
	}
	// Armed, the guard has not fired yet: the sibling refuses at once.
	return max(g.d-time.Since(g.armedAt), time.Nanosecond)
}

// stop stops the wait timeout without counting the request as served, once
// the round trip has returned.
func (g *waitGuard) stop() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.armed = false
	if g.timer != nil {
		g.timer.Stop()
	}
}

// cancel ends the guarded context, once the round trip no longer needs it.
func (g *waitGuard) cancel() { g.cancelCause(nil) }

// expired reports whether the wait timeout ended the request.
func (g *waitGuard) expired() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.timedOut
}

var _ proxy.WaitWatcher = (*waitGuard)(nil)
