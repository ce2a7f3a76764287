package proxy

import (
	"slices"
	"sync"
	"sync/atomic"
)

// roomWaiters are this process's requests paused because the table was
// full (see Transport.fullPause), oldest first. When one of the process's
// connections leaves the table, or goes idle (and so may be evicted), the
// oldest is woken to ask the pool again at once rather than at the end of
// its pause: in a table full of the process's own connections
// (conns_per_process) those are the events that make room. Room a sibling
// makes (a key freed fleet-wide, or its idle connection of the key) is
// still found at the end of a pause.
type roomWaiters struct {
	n  atomic.Int32 // len(q), read without the lock by signal
	mu sync.Mutex
	q  []chan struct{}
}

// add queues a waiter, woken by closing the channel it returns.
func (r *roomWaiters) add() chan struct{} {
	ch := make(chan struct{})
	r.mu.Lock()
	r.q = append(r.q, ch)
	r.n.Store(int32(len(r.q)))
	r.mu.Unlock()
	return ch
}

// remove takes the waiter ch out of the queue. If it was woken already, it
// wakes the next: the room it was woken for is not lost.
func (r *roomWaiters) remove(ch chan struct{}) {
	r.mu.Lock()
	if i := slices.Index(r.q, ch); i >= 0 {
		r.q = slices.Delete(r.q, i, i+1)
		r.n.Store(int32(len(r.q)))
		r.mu.Unlock()
		return
	}
	r.mu.Unlock()
	r.signal()
}

// signal wakes the oldest waiter, if any.
func (r *roomWaiters) signal() {
	if r.n.Load() == 0 {
		return
	}
	r.mu.Lock()
	if len(r.q) > 0 {
		close(r.q[0])
		r.q = slices.Delete(r.q, 0, 1)
		r.n.Store(int32(len(r.q)))
	}
	r.mu.Unlock()
}
