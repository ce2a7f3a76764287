package orbitpool

import (
	"sync"
	"sync/atomic"
)

// RoomWatch tells a caller that cannot wait in a key's queue when a unit of
// the key's capacity came back in another process of the fleet: a sibling's
// resource of the key got room to reserve. A process whose lane has no free
// slot (Acquire fails with ErrFull) can use only such a resource, yet if it
// queued on the key, younger waiters that could create would wait behind it.
// A watch takes no ticket and holds nobody up; it is rung as a waiter's lane
// is, once per watching process, and costs the fleet's other processes one
// load per unit they give back while no process watches.
//
// Use it as a waiter does: WatchRoom (or Rearm after a wake-up), then ask
// Acquire, then wait on Ready. A unit that comes back after WatchRoom or
// Rearm returned closes Ready; one that came back before is there for the
// Acquire that follows.
type RoomWatch struct {
	p    *Pool
	idx  int
	gen  uint32
	seen uint64 // the key's room count when it was armed
	ch   chan struct{}
	done bool // ch is closed
}

// roomWatches holds this process's RoomWatches, by key entry. Only this lane's
// bit in a key's watch mask reflects it, and only under mu.
type roomWatches struct {
	n      atomic.Int32 // watches registered, read without the lock by deliver
	mu     sync.Mutex
	keys   map[int]*keyWatches
	closed bool
}

type keyWatches struct {
	gen uint32
	ws  []*RoomWatch
}

// WatchRoom starts watching key for room on a sibling's resource. Close it
// when done: a watch left open costs every process giving back a unit of the
// key a doorbell.
func (p *Pool) WatchRoom(key Key) (*RoomWatch, error) {
	return onKey(p, key, func(ref keyRef) (*RoomWatch, error) { return p.watches.add(p, ref) })
}

func (t *roomWatches) add(p *Pool, ref keyRef) (*RoomWatch, error) {
	s := p.seg
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil, ErrClosed
	}
	if t.keys == nil {
		t.keys = make(map[int]*keyWatches)
	}
	kw := t.keys[ref.idx]
	if kw != nil && kw.gen != ref.gen {
		if c := atomic.LoadUint64(s.u64(s.keyOff(ref.idx) + kfCtl)); kState(c) != keyLive || kGen(c) != ref.gen {
			// It is the caller's reference that is out of date: the
			// entry went to another key, which this process watches,
			// since it was looked up. The watches here are that key's.
			return nil, errKeyGone
		}
		// The entry went to another key under the old key's watches,
		// which only a corrupt segment does (see Pool.awaited): they
		// would never be woken, so wake them to look the key up again.
		for _, w := range kw.ws {
			w.fire()
		}
		t.n.Add(-int32(len(kw.ws)))
		kw = nil
	}
	// The bit, and the count read, before the caller looks for room:
	// roomCame reads the mask after the unit is visible, and counts the
	// unit after it read the bit, so the look sees the unit or the count
	// moves past what the watch read.
	atomic.OrUint64(s.u64(s.watchOff(ref.idx, p.lane)), laneBit(p.lane))
	if c := atomic.LoadUint64(s.u64(s.keyOff(ref.idx) + kfCtl)); kState(c) != keyLive || kGen(c) != ref.gen {
		if kw == nil {
			atomic.AndUint64(s.u64(s.watchOff(ref.idx, p.lane)), ^laneBit(p.lane))
			delete(t.keys, ref.idx)
		}
		return nil, errKeyGone
	}
	if kw == nil {
		kw = &keyWatches{gen: ref.gen}
		t.keys[ref.idx] = kw
	}
	w := &RoomWatch{p: p, idx: ref.idx, gen: ref.gen, ch: make(chan struct{})}
	w.seen = atomic.LoadUint64(s.u64(s.keyOff(ref.idx) + kfRoomSeq))
	kw.ws = append(kw.ws, w)
	t.n.Add(1)
	return w, nil
}

// Ready is closed when a unit of the key came back in another process since
// the watch was armed, or when the pool closes.
func (w *RoomWatch) Ready() <-chan struct{} {
	t := &w.p.watches
	t.mu.Lock()
	defer t.mu.Unlock()
	return w.ch
}

// Rearm arms the watch again after Ready was closed, and returns how many
// units came back since it was last armed: the caller asks Acquire after
// Rearm and waits on the new Ready. It does nothing to an armed watch, and
// returns 0 for one that is over: its pool closed, or its key's entry ended
// its life under it (a corrupt segment). Watch again then.
func (w *RoomWatch) Rearm() (units uint64) {
	t := &w.p.watches
	t.mu.Lock()
	defer t.mu.Unlock()
	if !w.done || t.closed {
		return 0
	}
	if kw := t.keys[w.idx]; kw == nil || kw.gen != w.gen || !w.live() {
		return 0
	}
	seq := atomic.LoadUint64(w.p.seg.u64(w.p.seg.keyOff(w.idx) + kfRoomSeq))
	units, w.seen = seq-w.seen, seq
	w.ch, w.done = make(chan struct{}), false
	return units
}

// Close ends the watch. The key's watch bit goes with this process's last
// watch of it.
func (w *RoomWatch) Close() {
	p := w.p
	t := &p.watches
	t.mu.Lock()
	defer t.mu.Unlock()
	kw := t.keys[w.idx]
	if kw == nil || kw.gen != w.gen {
		return // closed already, or the entry's life ended under it
	}
	for i, o := range kw.ws {
		if o == w {
			kw.ws = append(kw.ws[:i], kw.ws[i+1:]...)
			t.n.Add(-1)
			break
		}
	}
	if len(kw.ws) == 0 {
		delete(t.keys, w.idx)
		if !t.closed {
			atomic.AndUint64(p.seg.u64(p.seg.watchOff(w.idx, p.lane)), ^laneBit(p.lane))
		}
	}
}

// live reports whether the watch's key entry is still in the life it was
// armed in. A watched entry is not collected (see Pool.awaited), so only a
// corrupt segment ends its life under it.
func (w *RoomWatch) live() bool {
	c := atomic.LoadUint64(w.p.seg.u64(w.p.seg.keyOff(w.idx) + kfCtl))
	return kState(c) == keyLive && kGen(c) == w.gen
}

func (w *RoomWatch) fire() {
	if !w.done {
		w.done = true
		close(w.ch)
	}
}

// deliver closes Ready of every watch whose key's room count moved since it
// was armed. The dispatcher runs it on each doorbell.
func (t *roomWatches) deliver(p *Pool) {
	if t.n.Load() == 0 {
		return
	}
	s := p.seg
	t.mu.Lock()
	defer t.mu.Unlock()
	for k, kw := range t.keys {
		seq := atomic.LoadUint64(s.u64(s.keyOff(k) + kfRoomSeq))
		for _, w := range kw.ws {
			if w.seen != seq || !w.live() {
				w.fire()
			}
		}
	}
}

// closeAll wakes every watch for good: the pool is closing. The lane's watch
// bits go with its reclaim.
func (t *roomWatches) closeAll() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.closed = true
	for _, kw := range t.keys {
		for _, w := range kw.ws {
			w.fire()
		}
	}
}

// roomCame tells the processes watching key entry k for room (see
// WatchRoom) that a unit of lane l's resource of it came back: its caller
// has made the unit visible, and set l's room bit. A process giving back a
// unit of its own resource by its own use does not tell itself (own): its
// users are its own to tell. A unit that comes back there by anything else
// (a sibling's reservation withdrawn, or aged out by this process's
// Reconcile) is told to lane l too, which would otherwise not know of it.
func (p *Pool) roomCame(l, k int, own bool) {
	s := p.seg
	self := -1
	if own {
		self = l
	}
	watched := false
	for i := range p.l.maskWords {
		m := atomic.LoadUint64(s.u64(s.watchOff(k, 64*i)))
		if self >= 0 && i == self>>6 {
			m &^= laneBit(self)
		}
		if watched = m != 0; watched {
			break
		}
	}
	if !watched {
		return
	}
	atomic.AddUint64(s.u64(s.keyOff(k)+kfRoomSeq), 1)
	for i := range p.l.maskWords {
		for m := atomic.LoadUint64(s.u64(s.watchOff(k, 64*i))); m != 0; m &= m - 1 {
			if w := i*64 + trailingZeros(m); w != self && w < p.l.nlanes {
				p.ring(w)
			}
		}
	}
}
