package backpressure

import (
	"context"
	"time"
	"weak"
)

const (
	// DefaultCap is the permit cap of a Limiter built without WithCap. A
	// permit stands for one in-flight upstream exchange (a connection's turn
	// and its relay buffers); 1024 is well above what the per-upstream
	// connection budgets let one process run at once, so the cap is a
	// process-wide backstop rather than the usual limit, and well below the
	// file and memory limits of a proxy process.
	DefaultCap = 1024

	// DefaultNearWindow is how close to its deadline a request may start new
	// work. Below about 50ms a forwarded request rarely completes (a new
	// upstream TLS handshake alone can take that long) and would only turn
	// into a late 504 after tying up a permit; refusing it now frees the
	// permit and tells the client at once.
	DefaultNearWindow = 50 * time.Millisecond
)

// Limiter is a concurrency cap with deadline-aware admission.
//
// Clones made by WithDeadline share one permit pool, which is what makes the
// cap process-wide; each clone carries its own deadline so that concurrent
// requests never race on shared deadline state. A Limiter is safe for
// concurrent use.
type Limiter struct {
	p        *pool
	deadline time.Time // zero: none
}

// Option configures a Limiter at construction.
type Option func(*pool)

// WithCap sets the permit cap. A cap of 0 builds a drained pool; a negative
// cap is treated as 0.
func WithCap(n int) Option {
	return func(p *pool) { p.cap.Store(clampCap(n)) }
}

// WithNearWindow sets how close to its deadline an acquire may still be
// granted (DefaultNearWindow by default). A window of 0 refuses only at the
// deadline itself; a negative one is treated as 0.
func WithNearWindow(d time.Duration) Option {
	return func(p *pool) { p.near = max(d, 0) }
}

// WithOnLeak has f told how many permits the collector returned each time
// it finds dropped ones (see [Limiter.Leaked]), so that a caller's bug is
// reported where it happens rather than only counted. f runs on the
// runtime's cleanup goroutine: it must not block.
func WithOnLeak(f func(n int)) Option {
	return func(p *pool) { p.onLeak = f }
}

// New returns a Limiter with its own permit pool.
func New(opts ...Option) *Limiter {
	p := &pool{near: DefaultNearWindow, now: time.Now}
	p.cap.Store(DefaultCap)
	p.batch.Store(new(weak.Pointer[permitBatch]))
	for _, o := range opts {
		o(p)
	}
	return &Limiter{p: p}
}

func clampCap(n int) int64 {
	return int64(min(max(n, 0), maxCap))
}

// WithDeadline returns a clone that shares l's permit pool and carries
// deadline. The zero time means no deadline of its own, so the clone behaves
// like one made by New apart from the shared pool. The context passed to
// Acquire may still impose an earlier deadline.
func (l *Limiter) WithDeadline(deadline time.Time) *Limiter {
	return &Limiter{p: l.p, deadline: deadline}
}

// DeadlineHint is the deadline this clone carries, if any; the context
// deadline of a particular acquire is not included.
func (l *Limiter) DeadlineHint() (time.Time, bool) {
	return l.deadline, !l.deadline.IsZero()
}

// NearWindow is how close to its deadline an acquire may still be granted.
func (l *Limiter) NearWindow() time.Duration { return l.p.near }

// Deadline is the deadline an acquire under ctx is judged by: the earlier of
// the clone's and ctx's, if either has one.
func (l *Limiter) Deadline(ctx context.Context) (time.Time, bool) {
	deadline, ok := l.deadline, !l.deadline.IsZero()
	if d, has := ctx.Deadline(); has && (!ok || d.Before(deadline)) {
		deadline, ok = d, true
	}
	return deadline, ok
}

// Check is the verdict an acquire under ctx would start with, without taking
// a permit: ctx's error if it is done (a deadline as ErrDeadlineElapsed),
// ErrDeadlineElapsed at or past the deadline, ErrDeadlineNear within the
// near-window before it, and nil otherwise. It lets every later claim point
// of a request that already holds a permit (a wait for a connection, a dial,
// a hand-over to another process) refuse on the same terms as the permit
// itself.
func (l *Limiter) Check(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return ctxError(err)
	}
	if deadline, ok := l.Deadline(ctx); ok {
		return l.p.verdict(l.p.now(), deadline)
	}
	return nil
}

// Active is the number of permits currently held. A test that ends with
// Active above zero has leaked a permit.
func (l *Limiter) Active() int { return int(l.p.state.Load() & activeMask) }

// Leaked is how many Permits of this Limiter and its clones were
// garbage-collected without Release, and so were returned by the collector.
// Anything above zero is a bug in a caller: a path that drops a permit, or a
// panic between Acquire and a Release that is not deferred.
func (l *Limiter) Leaked() uint64 { return l.p.leaked.Load() }

// MaxConcurrent is the permit cap.
func (l *Limiter) MaxConcurrent() int { return int(l.p.cap.Load()) }

// SetCap changes the cap of the shared pool. Lowering it lets held permits
// finish and grants new ones only once Active falls below the new cap.
// Setting it to 0 drains the pool: every acquire, including those already
// waiting, is refused with ErrQuotaExceeded. An acquire racing with the call
// may still be granted under the old cap.
func (l *Limiter) SetCap(n int) {
	p := l.p
	p.cap.Store(clampCap(n))
	p.mu.Lock()
	if n <= 0 {
		p.drainLocked()
	} else {
		p.serveLocked()
	}
	p.mu.Unlock()
}

// Acquire takes a permit, waiting if none is free.
//
// The deadline is the earlier of the clone's and ctx's. At or past it the
// result is ErrDeadlineElapsed; within the near-window before it,
// ErrDeadlineNear. Those checks come first because a refusal for time is
// more precise than one for capacity. A drained pool answers
// ErrQuotaExceeded. Otherwise Acquire waits, in arrival order, until a permit
// is handed over or the deadline comes within the near-window
// (ErrDeadlineNear); if ctx is cancelled first, the result is ctx's error.
func (l *Limiter) Acquire(ctx context.Context) (*Permit, error) {
	if err := l.acquire(ctx, true); err != nil {
		return nil, err
	}
	return l.p.permit(), nil
}

// TryAcquire is Acquire without the wait: when no permit is free it returns
// ErrSaturated at once. ctx contributes only its deadline and whether it is
// already done.
func (l *Limiter) TryAcquire(ctx context.Context) (*Permit, error) {
	if err := l.acquire(ctx, false); err != nil {
		return nil, err
	}
	return l.p.permit(), nil
}

// acquire decides and, on success, has taken the permit; the caller only
// hands it out.
func (l *Limiter) acquire(ctx context.Context, wait bool) error {
	p := l.p
	deadline, hasDeadline := l.Deadline(ctx)
	if err := ctx.Err(); err != nil {
		return ctxError(err)
	}
	var now time.Time
	if hasDeadline {
		now = p.now()
		if err := p.verdict(now, deadline); err != nil {
			return err
		}
	}
	if p.take() {
		return nil
	}
	if p.cap.Load() == 0 {
		return ErrQuotaExceeded
	}
	if !wait {
		return ErrSaturated
	}
	giveUp := deadline.Add(-p.near)
	return p.wait(ctx, hasDeadline, giveUp.Sub(now), func() error {
		if err := p.verdict(p.now(), deadline); err != nil {
			return err
		}
		return ErrDeadlineNear // the timer ran ahead of the clock
	})
}

// verdict is the deadline check shared by every acquire.
func (p *pool) verdict(now, deadline time.Time) error { return Verdict(now, deadline, p.near) }

// Verdict is seed 001's deadline check, for a claim point that has a deadline
// but no Limiter of its own (a process serving another's request, say):
// ErrDeadlineElapsed at or past deadline, ErrDeadlineNear within window
// before it, nil otherwise. A zero deadline is no deadline.
func Verdict(now, deadline time.Time, window time.Duration) error {
	if deadline.IsZero() {
		return nil
	}
	if !now.Before(deadline) {
		return ErrDeadlineElapsed
	}
	if !now.Before(deadline.Add(-window)) {
		return ErrDeadlineNear
	}
	return nil
}
