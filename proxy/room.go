package proxy

import (
	"container/list"
	"math"
	"sync"
	"sync/atomic"

	"github.com/orbitproxy/orbit/orbitpool"
)

// roomWaiters are this process's requests paused because the table was
// full (see Transport.fullPause), oldest first. An event that may make room
// wakes one of them to ask the pool again at once rather than at the end of
// its pause (see roomEvent). In a table full of the process's own
// connections (conns_per_process) those are the events that make room. Room
// a sibling makes (a key freed fleet-wide, or its idle connection of the
// key) is still found at the end of a pause.
//
// Events are numbered. A waiter remembers the number it had seen when it
// last asked the pool: one that an event has passed since is not queued (it
// asks again), and a woken waiter that leaves without the room, or could
// not take it (see Transport.once), passes the wake on to a waiter that has
// not asked since and could use it. So no event is lost, and none wakes
// more than the waiters that could use it.
type roomWaiters struct {
	events atomic.Uint64
	n      atomic.Int32 // waiters queued, read without the lock by signal
	mu     sync.Mutex
	all    list.List // of *roomWaiter, in the order they asked the pool
	byKey  map[orbitpool.Key]*list.List
}

// roomEvent is what made room, which says which waiters can use it.
type roomEvent uint8

const (
	// roomIdle: one of the process's connections went idle. A waiter
	// uses it by evicting it, or by reusing it if it is of its key.
	roomIdle roomEvent = iota
	// roomFree: a slot is free (a connection left the table, or a
	// creation permit was given back). Any waiter can use it.
	roomFree
	// roomStream: an HTTP/2 connection of the key has room for another
	// stream. Only the key's waiters can use it.
	roomStream
)

// roomWake is what made room: the event, and the key of the connection
// that made it (for roomIdle and roomStream).
type roomWake struct {
	event roomEvent
	key   orbitpool.Key
}

// usableBy reports whether rw could use the room w says has come. One that
// could not would pass the wake on again: an event that no waiter can use
// would go down the whole queue.
func (w roomWake) usableBy(rw *roomWaiter) bool {
	switch w.event {
	case roomStream:
		return rw.key == w.key
	case roomIdle:
		return !rw.stuck || rw.key == w.key
	}
	return true
}

type roomWaiter struct {
	key      orbitpool.Key
	seen     uint64   // events when it last asked the pool
	stuck    bool     // it may not evict (see roomWait)
	by       roomWake // what woke it; set before wake is closed
	wake     chan struct{}
	inAll    *list.Element
	inKey    *list.Element
	keyQueue *list.List
}

// roomWait is one request's place among the roomWaiters.
type roomWait struct {
	key   orbitpool.Key
	seen  uint64   // events when it last asked the pool
	woken bool     // by an event it has not used yet
	by    roomWake // that event
	// stuck: it may not evict an idle connection to make room (its last
	// eviction still holds its slot), so a roomIdle wake passed on skips
	// it, unless the idle connection is of its key.
	stuck bool
	w     *roomWaiter
	// fleet watches its key for room on a sibling's connection (see
	// fleetRoom), from the first time it found the table full.
	fleet *fleetWatch
}

// asking records that w asks the pool now.
func (r *roomWaiters) asking(w *roomWait) { w.seen = r.events.Load() }

// add queues w, and returns the channel that wakes it, or nil if an event
// has passed since it asked: the room may be there.
func (r *roomWaiters) add(w *roomWait) <-chan struct{} {
	rw := &roomWaiter{key: w.key, seen: w.seen, stuck: w.stuck, wake: make(chan struct{})}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.byKey == nil {
		r.byKey = make(map[orbitpool.Key]*list.List)
	}
	rw.keyQueue = r.byKey[w.key]
	if rw.keyQueue == nil {
		rw.keyQueue = new(list.List)
		r.byKey[w.key] = rw.keyQueue
	}
	rw.inAll = r.all.PushBack(rw)
	rw.inKey = rw.keyQueue.PushBack(rw)
	// Counted before events is read, as signal counts the event before it
	// reads n: one of the two sees the other.
	r.n.Add(1)
	if r.events.Load() != w.seen {
		r.take(rw)
		return nil
	}
	w.w = rw
	return rw.wake
}

// take takes rw out of the queue.
func (r *roomWaiters) take(rw *roomWaiter) {
	r.all.Remove(rw.inAll)
	rw.keyQueue.Remove(rw.inKey)
	if rw.keyQueue.Len() == 0 {
		delete(r.byKey, rw.key)
	}
	r.n.Add(-1)
}

// remove takes w out of the queue once its wait is over. If it was woken,
// it passes the wake on.
func (r *roomWaiters) remove(w *roomWait) {
	r.mu.Lock()
	defer r.mu.Unlock()
	select {
	case <-w.w.wake:
		r.wakeNext(w.w.by)
	default:
		r.take(w.w)
	}
	w.w = nil
}

// signal numbers wk, an event that may make room for any key (roomIdle or
// roomFree), and wakes the oldest waiter: one whose eviction is leaving may
// be free to evict again by now.
func (r *roomWaiters) signal(wk roomWake) {
	r.events.Add(1)
	if r.n.Load() == 0 {
		return
	}
	r.mu.Lock()
	r.wake(r.all.Front(), wk)
	r.mu.Unlock()
}

// signalKey numbers a roomStream event for key, room for n more streams,
// and wakes up to n of key's oldest waiters. If idle (the connection has no
// stream left), the room is an idle connection of key (roomIdle), which a
// waiter of another key may evict: key's oldest waiter has it first, else
// the oldest waiter; and one of key's that leaves without it passes it on
// as such.
func (r *roomWaiters) signalKey(key orbitpool.Key, n int, idle bool) {
	r.events.Add(1)
	if r.n.Load() == 0 {
		return
	}
	wk := roomWake{roomStream, key}
	if idle {
		wk.event = roomIdle
	}
	r.mu.Lock()
	woke := 0
	for ; woke < n; woke++ {
		l := r.byKey[key]
		if l == nil || !r.wake(l.Front(), wk) {
			break
		}
	}
	if idle && woke == 0 {
		r.wake(r.all.Front(), wk)
	}
	r.mu.Unlock()
}

// passOn hands a wake that its waiter did not use to the next waiter that
// could use it.
func (r *roomWaiters) passOn(wk roomWake) {
	r.mu.Lock()
	r.wakeNext(wk)
	r.mu.Unlock()
}

// wakeNext wakes, for a wake passed on, the oldest waiter that could use it.
func (r *roomWaiters) wakeNext(wk roomWake) {
	l := &r.all
	if wk.event == roomStream {
		if l = r.byKey[wk.key]; l == nil {
			return
		}
	}
	for e := l.Front(); e != nil; e = e.Next() {
		rw := e.Value.(*roomWaiter)
		if rw.seen == r.events.Load() {
			return // see wake
		}
		if wk.usableBy(rw) {
			r.wake(e, wk)
			return
		}
	}
}

// wake wakes the waiter at e (nil for none) for wk if it has not asked the
// pool since the last event, and reports whether it did. Queues are in the
// order their waiters asked: if the first has asked, all have.
func (r *roomWaiters) wake(e *list.Element, wk roomWake) bool {
	if e == nil {
		return false
	}
	rw := e.Value.(*roomWaiter)
	if rw.seen == r.events.Load() {
		return false
	}
	rw.by = wk
	close(rw.wake)
	r.take(rw)
	return true
}

// fleetRoom watches, for the requests of this process paused for room, the
// keys they wait on for room on a sibling's connection (orbitpool.RoomWatch),
// one watch per key however many wait, and hands each unit that comes back
// to the key's oldest paused request as a roomStream wake: a request that
// cannot use it passes it on, so a unit wakes one request, not all.
type fleetRoom struct {
	mu   sync.Mutex
	keys map[orbitpool.Key]*fleetWatch
}

type fleetWatch struct {
	key  orbitpool.Key
	refs int  // requests that watch through it
	over bool // its watch ended early (see relay)
	w    *orbitpool.RoomWatch
	stop chan struct{}
}

// watch has key watched for a request until the matching unwatch, and
// returns its watch: old, the one it had, unless that ended early (see
// relay); else one this process's requests of key share, or nil if key
// cannot be watched (the table has no entry for it). armed reports a watch
// armed just now, which cannot have seen room that came before: its request
// asks the pool again at once.
func (f *fleetRoom) watch(n *Node, key orbitpool.Key, old *fleetWatch) (fw *fleetWatch, armed bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if old != nil {
		if !old.over {
			return old, false
		}
		f.unwatchLocked(old)
	}
	if fw = f.keys[key]; fw != nil {
		fw.refs++
		return fw, false
	}
	w, err := n.pool.WatchRoom(key)
	if err != nil {
		return nil, false
	}
	if f.keys == nil {
		f.keys = make(map[orbitpool.Key]*fleetWatch)
	}
	fw = &fleetWatch{key: key, refs: 1, w: w, stop: make(chan struct{})}
	f.keys[key] = fw
	go f.relay(n, fw)
	return fw, true
}

// unwatch ends a watch that watch returned.
func (f *fleetRoom) unwatch(fw *fleetWatch) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.unwatchLocked(fw)
}

func (f *fleetRoom) unwatchLocked(fw *fleetWatch) {
	if fw.refs--; fw.refs > 0 {
		return
	}
	if f.keys[fw.key] == fw {
		delete(f.keys, fw.key)
	}
	close(fw.stop)
	fw.w.Close()
}

// relay wakes key's paused requests, one per unit that came back, until the
// watch ends. A watch that is over (the pool closed, or a corrupt segment
// ended its key entry's life) wakes them all, for the next to find the
// table as it is now and watch again.
func (f *fleetRoom) relay(n *Node, fw *fleetWatch) {
	for {
		select {
		case <-fw.w.Ready():
		case <-fw.stop:
			return
		}
		units := fw.w.Rearm() // before they ask again
		if units == 0 {
			f.mu.Lock()
			fw.over = true
			if f.keys[fw.key] == fw {
				delete(f.keys, fw.key)
			}
			f.mu.Unlock()
			n.room.signalKey(fw.key, math.MaxInt, false)
			return
		}
		n.room.signalKey(fw.key, int(min(units, math.MaxInt32)), false)
	}
}
