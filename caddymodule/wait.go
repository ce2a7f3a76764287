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
// at the latest when the round trip returns (end). The guard adds no deadline of
// its own: a deadline travels with the request to a sibling that forwards it
// and bounds the whole exchange there, which the wait timeout must not. The
// request's own deadline, when it has one (see Transport.deadline), is on
// the parent context and does exactly that.
//
// The proxy tells the guard when the head is written, and when it sends the
// request again after a failed attempt, which waits for a connection again:
// the guard is its proxy.WaitWatcher, and is armed again for that wait. An
// attempt refused before any work upstream (a sibling busy or leaving) was
// a wait too, from the guard's last arming on, so the retry gets what is
// left of that wait; after any other (a reused connection that closed
// before answering), a whole one.
//
// Every request through the transport makes one, so it holds what it needs
// itself (what it observes) rather than in closures: each is an allocation
// per request.
type waitGuard struct {
	ctx         context.Context
	cancelCause context.CancelCauseFunc
	waited      waitObserver // observes the wait once the round trip is over, if set
	start       time.Time
	d           time.Duration

	mu    sync.Mutex
	timer *time.Timer
	// Times since start, which keep the guard small: when the current
	// wait began, and when the request had its connection (0: not yet).
	armedAt time.Duration
	served  time.Duration
	// ownHead: served is the time this attempt's head went out, which a
	// sibling's wait for a worker may move later (see OwnerWaited); not
	// one an earlier attempt set, which a retry keeps.
	ownHead  bool
	armed    bool
	timedOut bool
	ended    bool
}

// newWaitGuard returns a guard over a context derived from parent. waited,
// if set, observes the time from start to when the request first had its
// connection, once the round trip is over (see end).
func newWaitGuard(parent context.Context, d time.Duration, waited waitObserver, start time.Time) *waitGuard {
	g := &waitGuard{armed: true, waited: waited, start: start, d: d}
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
// connection. A fire that finds the guard disarmed, or armed for a wait
// that has time left, is one the timer started before the guard was
// disarmed or armed anew: it waited for the lock, and does nothing.
func (g *waitGuard) fire() {
	g.mu.Lock()
	if !g.armed || time.Since(g.start) < g.armedAt+g.d {
		g.mu.Unlock()
		return
	}
	g.armed = false
	g.timedOut = true
	g.mu.Unlock()
	g.cancelCause(errWaitTimeout)
}

// WroteHeaders disarms the guard: the request has its connection, unless
// the sibling it went to refuses it (see Retrying).
func (g *waitGuard) WroteHeaders() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.armed {
		g.armed = false
		if g.timer != nil {
			g.timer.Stop()
		}
	}
	if g.served == 0 && !g.timedOut && !g.ended {
		g.served = max(time.Since(g.start), 1)
		g.ownHead = true
	}
}

// Retrying arms a disarmed guard again: the proxy is about to send the
// request again, and the retry waits for a connection. After a sibling's
// refusal the wait that the head's writing seemed to end went on: the
// request has not had its connection, and the guard keeps its bound,
// firing at once if it has passed. Otherwise the retry waits for the wait
// timeout anew. A guard still armed keeps its timer, so retries before any
// connection (failed dials) share the first wait's bound.
func (g *waitGuard) Retrying(refused bool) {
	g.mu.Lock()
	if refused {
		g.served = 0
	}
	g.ownHead = false
	if g.timedOut {
		// The timer fired, and may not have ended the context yet (fire
		// does so once it has let go of the lock): the proxy must find
		// it ended as Retrying returns, and send no retry.
		g.mu.Unlock()
		g.cancelCause(errWaitTimeout)
		return
	}
	if g.armed || g.timer == nil {
		g.mu.Unlock()
		return
	}
	left := g.d
	if now := time.Since(g.start); refused {
		left -= now - g.armedAt
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

// OwnerWaited moves the end of the request's wait d later: the sibling that
// owns its connection waited that long for a worker before taking it up.
// The wait ends no later than now, which bounds what a sibling reports; one
// that waited before the head's write was told (the frame goes ahead of the
// head) counted from the write would overlap it. Told before WroteHeaders,
// it does nothing: that call comes later, and its time has the sibling's
// wait in it. Nor does it for a retry after the request had its connection
// (a reused one that closed before answering): the wait ended then.
func (g *waitGuard) OwnerWaited(d time.Duration) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.ownHead && !g.timedOut && !g.ended {
		g.served = min(g.served+d, max(time.Since(g.start), 1))
	}
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
	return max(g.d-(time.Since(g.start)-g.armedAt), time.Nanosecond)
}

// end stops the wait timeout once the round trip has returned, with a
// response (served) or not, and observes the wait of a request that had its
// connection: a response is one, though the proxy told of no head.
func (g *waitGuard) end(served bool) {
	g.mu.Lock()
	if g.armed && g.timer != nil {
		g.timer.Stop()
	}
	g.armed = false
	if served && g.served == 0 && !g.timedOut {
		g.served = max(time.Since(g.start), 1)
	}
	observe := !g.ended && !g.timedOut && g.served != 0 && g.waited != nil
	g.ended = true
	g.mu.Unlock()
	if observe {
		g.waited.Observe(g.served.Seconds())
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
