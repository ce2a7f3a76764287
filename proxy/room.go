package proxy

import (
	"container/list"
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
	n      atomic.Int32 // q.Len(), read without the lock by signal
	mu     sync.Mutex
	q      list.List // of *roomWaiter, in the order they asked the pool
}

type roomWaiter struct {
	wake chan struct{}
	seen uint64 // events when it last asked the pool
}

// roomWait is one request's place among the roomWaiters.
type roomWait struct {
	seen  uint64 // events when it last asked the pool
	woken bool   // by an event, since it last asked
	e     *list.Element
}

// asking records that w asks the pool now.
func (r *roomWaiters) asking(w *roomWait) { w.seen = r.events.Load() }

// add queues w, and returns the channel that wakes it, or nil if an event
// has passed since it asked: the room may be there.
func (r *roomWaiters) add(w *roomWait) <-chan struct{} {
	rw := &roomWaiter{wake: make(chan struct{}), seen: w.seen}
	r.mu.Lock()
	defer r.mu.Unlock()
	w.e = r.q.PushBack(rw)
	// Counted before events is read, as signal counts the event before it
	// reads n: one of the two sees the other.
	r.n.Store(int32(r.q.Len()))
	if r.events.Load() != w.seen {
		r.q.Remove(w.e)
		r.n.Store(int32(r.q.Len()))
		return nil
	}
	return rw.wake
}

// remove takes w out of the queue. If it was woken already, it passes the
// wake on.
func (r *roomWaiters) remove(w *roomWait) {
	r.mu.Lock()
	defer r.mu.Unlock()
	select {
	case <-w.e.Value.(*roomWaiter).wake:
		r.wakeOldest()
	default:
		r.q.Remove(w.e)
		r.n.Store(int32(r.q.Len()))
	}
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
// event, and takes it out of the queue. The queue is in the order its
// waiters asked: if the oldest has, all have.
func (r *roomWaiters) wakeOldest() {
	e := r.q.Front()
	if e == nil {
		return
	}
	rw := e.Value.(*roomWaiter)
	if rw.seen == r.events.Load() {
		return
	}
	close(rw.wake)
	r.q.Remove(e)
	r.n.Store(int32(r.q.Len()))
}
