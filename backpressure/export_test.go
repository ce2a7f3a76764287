package backpressure

import "time"

// waiting is the number of queued waiters, so tests can tell that a caller
// has blocked without sleeping.
func (l *Limiter) waiting() int { return int(l.p.state.Load() >> 32) }

// setClock replaces the clock deadline decisions use.
func (l *Limiter) setClock(now func() time.Time) { l.p.now = now }
