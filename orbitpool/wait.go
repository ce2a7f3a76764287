package orbitpool

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
)

// waiterTable holds this process's goroutines parked on keys. Only the lane's
// own bit in a key's shared wait mask reflects it, and only under mu, so a
// registration and the last departure never race on that bit.
type waiterTable struct {
	mu     sync.Mutex
	keys   map[int]*keyWaiters
	closed bool
}

// keyWaiters is the FIFO of local waiters on one key entry, and the key's wake
// sequence as last delivered.
type keyWaiters struct {
	gen     uint32
	lastSeq uint64
	q       []*waiter
}

// waiter is one parked goroutine. Its channel is closed when it is woken.
type waiter struct {
	ch  chan struct{}
	key int
}

// watch registers a waiter on ref, at the back of the queue or, for a waiter
// that was woken and lost the race for what came back, at the front, so that
// losing a race never costs a waiter its place. The caller must re-check for
// capacity after watch returns and before it sleeps: a return of capacity
// after that re-check bumps the key's sequence and finds this lane's bit set,
// so it is never lost.
func (t *waiterTable) watch(p *Pool, ref keyRef, front bool) (*waiter, error) {
	s := p.seg
	w := &waiter{ch: make(chan struct{}), key: ref.idx}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil, ErrClosed
	}
	kw := t.keys[ref.idx]
	if kw != nil && kw.gen != ref.gen {
		koff := s.keyOff(ref.idx)
		if c := atomic.LoadUint64(s.u64(koff + kfCtl)); kState(c) != keyLive || kGen(c) != ref.gen {
			// It is the caller's reference that is out of date: the
			// entry went to another key since it was looked up.
			return nil, errKeyGone
		}
		// The entry was recycled under local waiters, which a set mask
		// bit forbids: the mask was corrupted. Nothing will ever wake
		// them through the old entry, so wake them now to re-check, and
		// queue afresh on the entry's new life.
		t.wakeFront(p, ref.idx, kw, uint64(len(kw.q)))
		kw = nil
		if p.opts.OnError != nil {
			p.opts.OnError(fmt.Errorf("orbitpool: key entry %d was recycled while this process had waiters on it: %w", ref.idx, ErrCorrupt))
		}
	}
	if kw == nil {
		koff := s.keyOff(ref.idx)
		atomic.OrUint64(s.u64(koff+kfMask), 1<<p.lane)
		// The entry might have been collected between the caller's lookup
		// and the mask bit: a collected entry has no mask bit, so checking
		// after setting it is enough.
		if c := atomic.LoadUint64(s.u64(koff + kfCtl)); kState(c) != keyLive || kGen(c) != ref.gen {
			atomic.AndUint64(s.u64(koff+kfMask), ^uint64(1<<p.lane))
			return nil, errKeyGone
		}
		kw = &keyWaiters{gen: ref.gen, lastSeq: atomic.LoadUint64(s.u64(koff + kfSeq))}
		t.keys[ref.idx] = kw
	}
	if front {
		kw.q = slices.Insert(kw.q, 0, w)
	} else {
		kw.q = append(kw.q, w)
	}
	atomic.AddUint32(s.u32(s.waitOff(p.lane, ref.idx)), 1)
	return w, nil
}

// cancel removes a waiter that stopped waiting. If it had been woken already,
// its wake-up is passed to the next waiter, so a unit of capacity is never
// left idle because the goroutine it was meant for went away.
func (t *waiterTable) cancel(p *Pool, w *waiter) {
	t.mu.Lock()
	defer t.mu.Unlock()
	kw := t.keys[w.key]
	select {
	case <-w.ch: // delivered (channels are closed under mu)
		if kw != nil && len(kw.q) > 0 {
			t.wakeFront(p, w.key, kw, 1)
		}
		return
	default:
	}
	if kw == nil {
		return
	}
	for i, x := range kw.q {
		if x == w {
			kw.q = append(kw.q[:i], kw.q[i+1:]...)
			atomic.AddUint32(p.seg.u32(p.seg.waitOff(p.lane, w.key)), ^uint32(0))
			break
		}
	}
	t.release(p, w.key, kw)
}

// deliver wakes as many local waiters on key k as units came back since the
// last delivery.
func (t *waiterTable) deliver(p *Pool, k int) {
	t.mu.Lock()
	if kw := t.keys[k]; kw != nil {
		t.deliverKey(p, k, kw)
	}
	t.mu.Unlock()
}

// deliverAll is deliver for every key with local waiters; the dispatcher runs
// it each time the doorbell rings. It reports whether it woke anyone.
func (t *waiterTable) deliverAll(p *Pool) bool {
	woke := false
	t.mu.Lock()
	for k, kw := range t.keys {
		woke = t.deliverKey(p, k, kw) || woke
	}
	t.mu.Unlock()
	return woke
}

func (t *waiterTable) deliverKey(p *Pool, k int, kw *keyWaiters) bool {
	seq := atomic.LoadUint64(p.seg.u64(p.seg.keyOff(k) + kfSeq))
	if seq == kw.lastSeq {
		return false
	}
	n := seq - kw.lastSeq
	kw.lastSeq = seq
	t.wakeFront(p, k, kw, n)
	return true
}

// wakeFront wakes up to n waiters from the front of kw's queue. mu is held.
func (t *waiterTable) wakeFront(p *Pool, k int, kw *keyWaiters, n uint64) {
	m := min(n, uint64(len(kw.q)))
	for _, w := range kw.q[:m] {
		close(w.ch)
	}
	kw.q = kw.q[m:]
	if m > 0 {
		atomic.AddUint32(p.seg.u32(p.seg.waitOff(p.lane, k)), -uint32(m))
	}
	t.release(p, k, kw)
}

// release drops kw and this lane's mask bit once no local waiter remains.
func (t *waiterTable) release(p *Pool, k int, kw *keyWaiters) {
	if len(kw.q) > 0 {
		return
	}
	delete(t.keys, k)
	atomic.AndUint64(p.seg.u64(p.seg.keyOff(k)+kfMask), ^uint64(1<<p.lane))
}

// closeAll wakes every waiter for good: the pool is closing.
func (t *waiterTable) closeAll(p *Pool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.closed = true
	for k, kw := range t.keys {
		for _, w := range kw.q {
			close(w.ch)
		}
		kw.q = nil
		t.release(p, k, kw)
	}
}

// Readiness is a registration on a key, for callers that wait in their own
// select loop rather than in Acquire. Its channel is closed once capacity may
// have come back (a resource completed, registered or unregistered, or budget
// returned) anywhere in the fleet. Use it as Acquire does: Watch, re-check,
// then wait on Ready; after a wake-up, re-check and Watch again if needed.
type Readiness struct {
	p *Pool
	w *waiter
}

// Watch registers the caller on key.
func (p *Pool) Watch(key Key) (*Readiness, error) { return p.watch(key, false) }

func (p *Pool) watch(key Key, front bool) (*Readiness, error) {
	for range maxKeyRetries {
		ref, err := p.internKey(key)
		if err != nil {
			return nil, err
		}
		w, err := p.waiters.watch(p, ref, front)
		if err == errKeyGone {
			continue
		}
		if err != nil {
			return nil, err
		}
		return &Readiness{p: p, w: w}, nil
	}
	return nil, errKeyChurn(key)
}

// Ready is closed when the caller should re-check.
func (r *Readiness) Ready() <-chan struct{} { return r.w.ch }

// Close ends the registration. A wake-up it received is passed on to the next
// waiter on the key, so capacity is never left idle behind a caller that went
// away; a caller that used the capacity costs another waiter a re-check at most.
func (r *Readiness) Close() { r.p.waiters.cancel(r.p, r.w) }
