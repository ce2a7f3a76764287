package orbitpool

import (
	"fmt"
	"sync"
	"sync/atomic"
)

// waiterTable holds this process's goroutines parked on keys, each key's in
// ticket order. Only this lane's bit in a key's shared wait mask and its
// queue word reflect it, and only under mu.
type waiterTable struct {
	mu     sync.Mutex
	keys   map[int]*keyWaiters
	closed bool
}

// keyWaiters is the queue of local waiters on one key entry, oldest ticket
// first.
type keyWaiters struct {
	gen uint32
	q   []*waiter
	// granted counts the waiters of q with granted set, so that sync
	// knows how many wait without walking the whole queue: a capped key
	// may have thousands of waiters, and sync runs on every hand-off.
	granted int
}

// waiter is one parked goroutine, from its first registration on a key to
// the end of its acquisition: it keeps its ticket, and so its place in the
// fleet's queue, across wake-ups that found nothing.
type waiter struct {
	ch      chan struct{} // closed when the waiter is granted a unit (or the pool closes)
	key     int
	gen     uint32
	ticket  uint64
	granted bool // ch is closed and the grant not yet taken or passed on
}

// register queues a waiter on ref with a new ticket, the youngest of the
// fleet's. The caller must check for capacity after register returns and
// before it sleeps (see eligible): a return of capacity after that finds this
// waiter's mask bit and queue word, so it is never lost.
func (t *waiterTable) register(p *Pool, ref keyRef) (*waiter, error) {
	s := p.seg
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil, ErrClosed
	}
	kw := t.keys[ref.idx]
	koff := s.keyOff(ref.idx)
	if kw != nil && kw.gen != ref.gen {
		if c := atomic.LoadUint64(s.u64(koff + kfCtl)); kState(c) != keyLive || kGen(c) != ref.gen {
			// It is the caller's reference that is out of date: the
			// entry went to another key since it was looked up.
			t.mu.Unlock()
			return nil, errKeyGone
		}
		// The entry was recycled under local waiters, which a set mask
		// bit forbids: the mask was corrupted. Nothing will ever wake
		// them through the old entry, so wake them now to re-check, and
		// keep them queued, in their order, on the entry's new life.
		for _, w := range kw.q {
			w.gen = ref.gen
			if !w.granted {
				w.granted = true
				kw.granted++
				close(w.ch)
			}
		}
		kw.gen = ref.gen
		if p.opts.OnError != nil {
			p.opts.OnError(fmt.Errorf("orbitpool: key entry %d was recycled while this process had waiters on it: %w", ref.idx, ErrCorrupt))
		}
	}
	atomic.OrUint64(s.u64(s.maskOff(ref.idx, p.lane)), laneBit(p.lane))
	if kw == nil {
		// The entry might have been collected between the caller's lookup
		// and the mask bit: a collected entry has no mask bit, so checking
		// after setting it is enough.
		if c := atomic.LoadUint64(s.u64(koff + kfCtl)); kState(c) != keyLive || kGen(c) != ref.gen {
			atomic.AndUint64(s.u64(s.maskOff(ref.idx, p.lane)), ^laneBit(p.lane))
			t.mu.Unlock()
			return nil, errKeyGone
		}
		kw = &keyWaiters{gen: ref.gen}
		t.keys[ref.idx] = kw
	}
	w := &waiter{
		ch:     make(chan struct{}),
		key:    ref.idx,
		gen:    ref.gen,
		ticket: atomic.AddUint64(s.u64(koff+kfTicket), 1),
	}
	kw.q = append(kw.q, w)
	pass := t.sync(p, ref.idx, kw)
	t.mu.Unlock()
	p.wake(ref.idx, pass)
	return w, nil
}

// eligible reports whether w may try for capacity now: it holds a grant, or
// no waiter anywhere in the fleet that is still waiting has an older ticket.
// A waiter that is not eligible leaves what it saw to the older one, which
// checked after it registered, or is granted the next unit that comes back.
func (t *waiterTable) eligible(p *Pool, w *waiter) bool {
	t.mu.Lock()
	kw := t.keys[w.key]
	if kw == nil || kw.gen != w.gen {
		t.mu.Unlock()
		return true // queued no more: let it find out by trying
	}
	if w.granted {
		t.mu.Unlock()
		return true
	}
	// An older waiter handed a unit it has not taken yet is to be let
	// take it.
	behindGrant := false
	for _, x := range kw.q {
		if x == w {
			break
		}
		if !x.granted {
			t.mu.Unlock()
			return false
		}
		behindGrant = true
	}
	t.mu.Unlock()
	s := p.seg
	for i := range p.l.maskWords {
		m := atomic.LoadUint64(s.u64(s.keyOff(w.key) + kfMasks + 8*i))
		for ; m != 0; m &= m - 1 {
			l := i*64 + trailingZeros(m)
			if l == p.lane || l >= p.l.nlanes {
				continue
			}
			t, q, ok, h := s.laneOrder(l, w.key)
			if ok && ticketBefore(t, uint32(w.ticket)) {
				return false
			}
			// Grants the lane has not delivered go to its oldest
			// waiting waiters, from the one its word names; those it
			// has delivered are on their way to the waiter it holds.
			if qGrants(q) > 0 && ticketBefore(qTicket(q), uint32(w.ticket)) {
				behindGrant = true
			}
			if h&qHeldValid != 0 && ticketBefore(uint32(h), uint32(w.ticket)) {
				behindGrant = true
			}
		}
	}
	if !behindGrant {
		return true
	}
	// Units that came back when no waiter was there to take them are
	// this waiter's, for it has now published itself: the process that
	// returned them either saw it (and handed one to it) or left them
	// here before it looked.
	unclaimed := s.u64(s.keyOff(w.key) + kfUnclaimed)
	for range 8 {
		u := atomic.LoadUint64(unclaimed)
		if u == 0 {
			return false
		}
		if atomic.CompareAndSwapUint64(unclaimed, u, u-1) {
			return true
		}
	}
	return false
}

// take is called by a waiter whose channel was closed. It reports whether the
// waiter was granted a unit (rather than woken by Close), and queues it again
// in its place with a fresh channel, so that a further grant while it tries
// is not lost: a waiter that then finds capacity passes such a grant on.
func (t *waiterTable) take(p *Pool, w *waiter) (ch <-chan struct{}, granted bool) {
	t.mu.Lock()
	kw := t.keys[w.key]
	if t.closed || !w.granted || kw == nil || kw.gen != w.gen {
		t.mu.Unlock()
		return w.ch, false
	}
	w.granted = false
	kw.granted--
	w.ch = make(chan struct{})
	ch = w.ch
	pass := t.sync(p, w.key, kw)
	t.mu.Unlock()
	p.wake(w.key, pass)
	return ch, true
}

// leave takes w out of the queue: its acquisition is over. A grant it was
// given and did not use is passed on to the next oldest waiter of the fleet,
// and so is one given while it used another (used says it took capacity),
// so that a unit of capacity is never left idle because the goroutine it was
// meant for went away.
func (t *waiterTable) leave(p *Pool, w *waiter, holding bool) {
	t.mu.Lock()
	if t.closed {
		// closeAll passed on the grants it found, and the lane may be
		// another process's by now. A unit the waiter had taken and was
		// trying with goes to the other processes' waiters (see
		// grantLanes), while the key entry is the one it was taken on.
		t.mu.Unlock()
		c := atomic.LoadUint64(p.seg.u64(p.seg.keyOff(w.key) + kfCtl))
		if holding && kState(c) == keyLive && kGen(c) == w.gen {
			p.wake(w.key, 1)
		}
		return
	}
	var pass uint64
	if holding {
		pass++
	}
	granted := w.granted
	if granted {
		w.granted = false
		pass++
	}
	if kw := t.keys[w.key]; kw != nil && kw.gen == w.gen {
		for i, x := range kw.q {
			if x == w {
				if granted {
					kw.granted--
				}
				if i == 0 {
					// The common case, the oldest leaving, costs
					// no copy of the queue.
					kw.q[0] = nil
					kw.q = kw.q[1:]
				} else {
					kw.q = append(kw.q[:i], kw.q[i+1:]...)
				}
				pass += t.sync(p, w.key, kw)
				t.release(p, w.key, kw)
				break
			}
		}
	}
	t.mu.Unlock()
	p.wake(w.key, pass)
}

// sync makes this lane's queue word for key k agree with kw: it delivers the
// grants other processes added to the oldest waiting waiters, then publishes
// how many wait and the oldest one's ticket. It returns the grants it could
// not deliver, for the caller to pass on once mu is released. mu is held.
func (t *waiterTable) sync(p *Pool, k int, kw *keyWaiters) uint64 {
	s := p.seg
	off := s.queueOff(p.lane, k)
	qw, hw := s.u64(off), s.u64(off+qHeldOff)
	for {
		q := atomic.LoadUint64(qw)
		// The grants go to the oldest waiters not granted yet; the rest
		// of those wait. The walk stops once it has seen what it
		// publishes: the oldest of them, the given and the granted.
		open := len(kw.q) - kw.granted
		give := min(qGrants(q), open)
		waiting := open - give
		given, seen, grantedSeen := 0, 0, 0
		var next [3]uint64 // the oldest waiting tickets
		var held uint64    // the oldest delivered grant not taken
		for _, w := range kw.q {
			if given == give && seen >= min(waiting, len(next)) && (held != 0 || grantedSeen == kw.granted) {
				break
			}
			switch {
			case w.granted:
				grantedSeen++
			case given < give:
				given++
			default:
				if seen < len(next) {
					next[seen] = w.ticket
				}
				seen++
				continue
			}
			if held == 0 {
				held = heldWord(w.ticket)
			}
		}
		// A waiter moves between the first word and the held one: it is
		// in both while the first is swapped, and a sibling reads the
		// held word before and after the first (laneOrder), so that it
		// never finds the waiter in neither.
		storeHeld(hw, olderHeld(atomic.LoadUint64(hw), held))
		atomic.StoreUint64(s.u64(off+8), uint64(uint32(next[1]))|uint64(uint32(next[2]))<<32)
		if !atomic.CompareAndSwapUint64(qw, q, queueWord(next[0], waiting)) {
			continue // a grant came in meanwhile
		}
		storeHeld(hw, held)
		left := uint64(qGrants(q) - given)
		kw.granted += given
		for _, w := range kw.q {
			if given == 0 {
				break
			}
			if !w.granted {
				w.granted = true
				close(w.ch)
				given--
			}
		}
		atomic.StoreUint32(s.u32(s.waitOff(p.lane, k)), uint32(len(kw.q)))
		return left
	}
}

// deliver delivers the grants for key k this lane was given. It reports
// false, delivering nothing, once the table is closed.
func (t *waiterTable) deliver(p *Pool, k int) bool {
	var pass uint64
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return false
	}
	if kw := t.keys[k]; kw != nil {
		pass = t.sync(p, k, kw)
	}
	t.mu.Unlock()
	p.wake(k, pass)
	return true
}

// deliverAll is deliver for every key with local waiters; the dispatcher runs
// it each time the doorbell rings. It reports whether it woke anyone.
func (t *waiterTable) deliverAll(p *Pool) bool {
	woke := false
	var passes []keyPass
	t.mu.Lock()
	for k, kw := range t.keys {
		if q := atomic.LoadUint64(p.seg.u64(p.seg.queueOff(p.lane, k))); qGrants(q) == 0 {
			continue
		}
		woke = true
		if n := t.sync(p, k, kw); n != 0 {
			passes = append(passes, keyPass{k, n})
		}
	}
	t.mu.Unlock()
	for _, kp := range passes {
		p.wake(kp.k, kp.n)
	}
	return woke
}

type keyPass struct {
	k int
	n uint64
}

// release drops kw, this lane's queue word and its mask bit once no local
// waiter remains. mu is held.
func (t *waiterTable) release(p *Pool, k int, kw *keyWaiters) {
	if len(kw.q) > 0 {
		return
	}
	delete(t.keys, k)
	s := p.seg
	atomic.AndUint64(s.u64(s.maskOff(k, p.lane)), ^laneBit(p.lane))
	// With nobody left waiting, units counted as unclaimed stand for
	// nothing a waiter needs: a newcomer tries for capacity itself. Left
	// counted, they would let a later waiter pass an older one's grant.
	if !p.queued(k) {
		u := s.u64(s.keyOff(k) + kfUnclaimed)
		if n := atomic.LoadUint64(u); n != 0 {
			atomic.CompareAndSwapUint64(u, n, 0)
		}
	}
}

// closeAll wakes every waiter for good: the pool is closing. Grants this lane
// was given go to the waiters of other processes.
func (t *waiterTable) closeAll(p *Pool) {
	var passes []keyPass
	t.mu.Lock()
	t.closed = true
	for k, kw := range t.keys {
		var n uint64
		for _, w := range kw.q {
			if w.granted {
				n++
			} else {
				close(w.ch)
			}
		}
		kw.q, kw.granted = nil, 0
		n += t.sync(p, k, kw)
		t.release(p, k, kw)
		passes = append(passes, keyPass{k, n})
	}
	t.mu.Unlock()
	for _, kp := range passes {
		p.wake(kp.k, kp.n)
	}
}

// Readiness is a registration on a key, for callers that wait in their own
// select loop rather than in Acquire. It takes its place in the key's
// fleet-wide queue, and its channel is closed when a unit of capacity that
// came back anywhere in the fleet is handed to it: when it is the oldest
// waiter. Use it as Acquire does: Watch, re-check, then wait on Ready; after a
// wake-up, re-check, and Close (which passes an unused unit on to the next
// waiter) or Watch again if needed.
type Readiness struct {
	p *Pool
	w *waiter
}

// Watch registers the caller on key.
func (p *Pool) Watch(key Key) (*Readiness, error) {
	w, err := p.register(key)
	if err != nil {
		return nil, err
	}
	return &Readiness{p: p, w: w}, nil
}

func (p *Pool) register(key Key) (*waiter, error) {
	return onKey(p, key, func(ref keyRef) (*waiter, error) { return p.waiters.register(p, ref) })
}

// onKey runs f on key's entry, naming the key if needed, and again on its
// next entry while f finds the entry gone to another key (errKeyGone).
func onKey[T any](p *Pool, key Key, f func(keyRef) (T, error)) (T, error) {
	var zero T
	for range maxKeyRetries {
		ref, err := p.internKey(key)
		if err != nil {
			return zero, err
		}
		v, err := f(ref)
		if err == errKeyGone {
			continue
		}
		return v, err
	}
	return zero, errKeyChurn(key)
}

// Ready is closed when the caller should re-check.
func (r *Readiness) Ready() <-chan struct{} { return r.w.ch }

// Close ends the registration and has the next waiter on the key look again,
// with the unit it was handed if any: the caller may have left capacity that
// waiters younger than it deferred to, and it is never left idle behind a
// caller that went away. A caller that used the capacity costs another waiter
// a re-check at most.
func (r *Readiness) Close() { r.p.waiters.leave(r.p, r.w, true) }
