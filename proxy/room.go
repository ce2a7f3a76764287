package proxy

import (
	"slices"
	"sync"
	"sync/atomic"
)

// roomWaiters are this process's requests paused because the table was
// full (see Transport.fullPause), oldest first. When one of the process's
// connections leaves the table, goes idle (and so may be evicted), or ends
// an HTTP/2 stream, the oldest is woken to ask the pool again at once
// rather than at the end of its pause: in a table full of the process's own
// connections (conns_per_process) those are the events that make room.
// Room a sibling makes (a key freed fleet-wide, or its idle connection of
// the key) is still found at the end of a pause.
//
// Each event is numbered. A waiter remembers the number it had seen when
// it last asked the pool: one that an event has passed since is not queued
// (it asks again), and a woken waiter that could not use the room passes
// the wake on to the oldest that has not asked since the event. So no
// event is lost, and none wakes a waiter twice.
type roomWaiters struct {
	events atomic.Uint64
	n      atomic.Int32 // len(q), read without the lock by signal
	mu     sync.Mutex
	q      []roomWaiter
}

type roomWaiter struct {
	wake chan struct{}
	seen uint64 // events when it last asked the pool
}

// roomWait is one request's place among the roomWaiters.
type roomWait struct {
	seen  uint64 // events when it last asked the pool
	woken bool   // by an event, since it last asked
}

// asking records that w asks the pool now.
func (r *roomWaiters) asking(w *roomWait) { w.seen = r.events.Load() }

// add queues w, and returns the channel that wakes it, or nil if an event
// has passed since it asked: the room may be there.
func (r *roomWaiters) add(w *roomWait) chan struct{} {
	ch := make(chan struct{})
	r.mu.Lock()
	defer r.mu.Unlock()
	r.q = append(r.q, roomWaiter{ch, w.seen})
	// Counted before events is read, as signal counts the event before it
	// reads n: one of the two sees the other.
	r.n.Store(int32(len(r.q)))
	if r.events.Load() != w.seen {
		r.q = r.q[:len(r.q)-1]
		r.n.Store(int32(len(r.q)))
		return nil
	}
	return ch
}

// remove takes the waiter ch out of the queue. If it was woken already, it
// passes the wake on.
func (r *roomWaiters) remove(ch chan struct{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if i := slices.IndexFunc(r.q, func(w roomWaiter) bool { return w.wake == ch }); i >= 0 {
		r.q = slices.Delete(r.q, i, i+1)
		r.n.Store(int32(len(r.q)))
		return
	}
	r.wakeOldest()
}

// signal numbers an event, and wakes the oldest waiter.
func (r *roomWaiters) signal() {
	r.events.Add(1)
	if r.n.Load() == 0 {
		return
	}
	r.mu.Lock()
	r.wakeOldest()
	r.mu.Unlock()
}

// passOn wakes the oldest waiter for the last event, which its waker could
// not use.
func (r *roomWaiters) passOn() {
	r.mu.Lock()
	r.wakeOldest()
	r.mu.Unlock()
}

// wakeOldest wakes the oldest waiter if it has not asked since the last
// event. The queue is in the order its waiters asked: if the oldest has,
// all have.
func (r *roomWaiters) wakeOldest() {
	if len(r.q) == 0 || r.q[0].seen == r.events.Load() {
		return
	}
	close(r.q[0].wake)
	r.q = slices.Delete(r.q, 0, 1)
	r.n.Store(int32(len(r.q)))
}
