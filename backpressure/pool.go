package backpressure

import (
	"container/list"
	"context"
	"sync"
	"sync/atomic"
	"time"
	"weak"
)

const (
	activeMask = 1<<32 - 1 // permits in use, in the low half of pool.state
	oneWaiter  = 1 << 32   // one queued waiter, in the high half
	maxCap     = 1 << 30   // keeps increments clear of the waiter half
)

// pool is the permit pool all clones of a Limiter share.
type pool struct {
	// state packs the permits in use (low 32 bits) and the queued waiters
	// (high 32 bits) into one word, so that "is anyone waiting?" and "take a
	// permit" are one compare-and-swap. That keeps the uncontended path
	// lock-free and lets a waiter register without missing a release that
	// races with it.
	state  atomic.Uint64
	cap    atomic.Int64
	leaked atomic.Uint64 // permits returned by the collector
	onLeak func(n int)   // see WithOnLeak; nil: none

	batch atomic.Pointer[weak.Pointer[permitBatch]] // never nil; see permitBatch

	near time.Duration
	now  func() time.Time // the clock deadline decisions use; tests replace it

	mu    sync.Mutex
	queue list.List // of *waiter, in arrival order; guarded by mu
}

// waiter is a caller parked for a permit. done and err are written under
// pool.mu before ready is closed; err is nil for a granted permit.
type waiter struct {
	ready chan struct{}
	done  bool
	err   error
	elem  *list.Element // in pool.queue while queued
}

// take is the lock-free path. Queued waiters have priority, which is what
// keeps service in arrival order.
func (p *pool) take() bool {
	for {
		s := p.state.Load()
		if s>>32 != 0 || int64(s&activeMask) >= p.cap.Load() {
			return false
		}
		if p.state.CompareAndSwap(s, s+1) {
			return true
		}
	}
}

// wait parks until a permit is handed over, ctx is done, or the timer (when
// hasTimer) fires; expired decides which refusal a fired timer means.
func (p *pool) wait(ctx context.Context, hasTimer bool, d time.Duration, expired func() error) error {
	p.mu.Lock()
	for {
		if p.cap.Load() == 0 {
			p.mu.Unlock()
			return ErrQuotaExceeded
		}
		s := p.state.Load()
		if s>>32 == 0 && int64(s&activeMask) < p.cap.Load() {
			if p.state.CompareAndSwap(s, s+1) {
				p.mu.Unlock()
				return nil
			}
			continue
		}
		// Registering in the same word a releaser checks means a release
		// either happened before this CAS (and the retry sees the free
		// permit) or sees the waiter and serves the queue.
		if p.state.CompareAndSwap(s, s+oneWaiter) {
			break
		}
	}
	w := &waiter{ready: make(chan struct{})}
	w.elem = p.queue.PushBack(w)
	p.mu.Unlock()

	var fired <-chan time.Time
	if hasTimer {
		t := time.NewTimer(d)
		defer t.Stop()
		fired = t.C
	}
	var err error
	select {
	case <-w.ready:
		return w.err
	case <-ctx.Done():
		err = ctxError(ctx.Err())
	case <-fired:
		err = expired()
	}

	p.mu.Lock()
	if w.done {
		// Served as we gave up: a permit is passed on rather than lost.
		p.mu.Unlock()
		if w.err == nil {
			p.release()
		}
		return err
	}
	p.queue.Remove(w.elem)
	p.state.Add(^uint64(oneWaiter - 1))
	p.mu.Unlock()
	return err
}

func (p *pool) release() {
	for {
		s := p.state.Load()
		if s>>32 != 0 {
			break
		}
		if p.state.CompareAndSwap(s, s-1) {
			return
		}
	}
	p.mu.Lock()
	p.state.Add(^uint64(0))
	p.serveLocked()
	p.mu.Unlock()
}

// serveLocked hands free permits to waiters in arrival order. On return
// either the queue is empty or no permit is free, which is why a waiter that
// gives up never has to wake the next one.
func (p *pool) serveLocked() {
	for e := p.queue.Front(); e != nil; e = p.queue.Front() {
		w := e.Value.(*waiter)
		s := p.state.Load()
		if int64(s&activeMask) >= p.cap.Load() {
			return
		}
		if !p.state.CompareAndSwap(s, s+1-oneWaiter) {
			continue
		}
		p.queue.Remove(w.elem)
		w.done = true
		close(w.ready)
	}
}

// drainLocked refuses every queued waiter: with a cap of 0 none would ever be
// served.
func (p *pool) drainLocked() {
	for e := p.queue.Front(); e != nil; e = p.queue.Front() {
		w := e.Value.(*waiter)
		p.queue.Remove(w.elem)
		p.state.Add(^uint64(oneWaiter - 1))
		w.done, w.err = true, ErrQuotaExceeded
		close(w.ready)
	}
}
