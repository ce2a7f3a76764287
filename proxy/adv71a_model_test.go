package proxy

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/orbitproxy/orbit/orbitpool"
)

// adv71aModel is a plain reference model of roomWaiters: a slice in the
// order waiters were queued, scanned whole on every operation (no early stop
// relying on the queue being sorted by what each waiter has seen).
type adv71aModel struct {
	events uint64
	queue  []int // indices into waiters, oldest first
}

type adv71aW struct {
	rw     roomWait
	ch     <-chan struct{}
	queued bool     // in the model's queue
	woken  bool     // woken, its wake not yet used or passed on
	by     roomWake // what woke it
	stuck  bool
	key    orbitpool.Key
	seen   uint64
}

func (m *adv71aModel) drop(i int) {
	for j, x := range m.queue {
		if x == i {
			m.queue = append(m.queue[:j:j], m.queue[j+1:]...)
			return
		}
	}
}

// first is the oldest queued waiter that matches, or -1.
func (m *adv71aModel) first(ws []*adv71aW, match func(*adv71aW) bool) int {
	for _, i := range m.queue {
		if ws[i].seen != m.events && match(ws[i]) {
			return i
		}
	}
	return -1
}

// passOn: the oldest waiter that has not asked since the last event and
// could use wk: of its key for a stream, one that may evict or is of its
// key for an idle connection, any for a free slot.
func (m *adv71aModel) passOn(ws []*adv71aW, wk roomWake) int {
	return m.first(ws, func(w *adv71aW) bool { return adv71aUsable(w, wk) })
}

func adv71aUsable(w *adv71aW, wk roomWake) bool {
	switch wk.event {
	case roomStream:
		return w.key == wk.key
	case roomIdle:
		return !w.stuck || w.key == wk.key
	}
	return true
}

// TestAdv71aRoomWaitersModel drives roomWaiters and the reference model with
// the same random operations (seeded): asks and adds (with events between
// the two), pauses that end by timer, cancellations that come exactly when a
// wake is delivered, woken waiters that use the wake, pass it on, or ask
// again (passing it on first if they may not evict, as fullPause does),
// signal, signalKey and bare passOn. After every operation it asserts: the
// operation woke at most one waiter, exactly the one the model wakes (so an
// event with a waiter that could use it is never left unconsumed), and the
// counters (n, the list, byKey) match the queued waiters exactly.
func TestAdv71aRoomWaitersModel(t *testing.T) {
	for seed := uint64(1); seed <= 40; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { adv71aRunModel(t, seed, 3000) })
	}
}

func adv71aRunModel(t *testing.T, seed uint64, steps int) {
	rng := rand.New(rand.NewPCG(seed, seed*7919))
	var r roomWaiters
	var m adv71aModel
	keys := []orbitpool.Key{{Lo: 1}, {Lo: 2}, {Lo: 3}}
	nw := 2 + rng.IntN(9)
	ws := make([]*adv71aW, nw)
	for i := range ws {
		k := keys[rng.IntN(len(keys))]
		ws[i] = &adv71aW{key: k, rw: roomWait{key: k}}
	}
	closed := func(w *adv71aW) bool {
		if w.ch == nil {
			return false
		}
		select {
		case <-w.ch:
			return true
		default:
			return false
		}
	}
	// newlyWoken returns the queued waiters (in the model) whose channel is
	// now closed.
	newlyWoken := func() []int {
		var got []int
		for i, w := range ws {
			if w.queued && closed(w) {
				got = append(got, i)
			}
		}
		return got
	}
	var log []string
	globalEvent, consumed := false, false
	var lastWake roomWake       // the last event for any key
	anyKey := func() roomWake { // roomIdle or roomFree
		return roomWake{roomEvent(rng.IntN(2)), keys[rng.IntN(len(keys))]}
	}
	fail := func(format string, a ...any) {
		t.Helper()
		tail := log
		if len(tail) > 12 {
			tail = tail[len(tail)-12:]
		}
		t.Fatalf("seed %d step %d: %s\nlast ops: %v", seed, len(log), fmt.Sprintf(format, a...), tail)
	}
	// expect checks that the operation woke exactly want (-1 for none) and
	// applies it to the model.
	expect := func(op string, want int, wk roomWake) {
		t.Helper()
		got := newlyWoken()
		if len(got) > 1 {
			fail("%s woke %d waiters %v; want at most one", op, len(got), got)
		}
		g := -1
		if len(got) == 1 {
			g = got[0]
		}
		if g != want {
			fail("%s woke %d; the model wakes %d (queue %v, events %d)", op, g, want, m.queue, m.events)
		}
		if want >= 0 {
			if got := ws[want].rw.w.by; got != wk {
				fail("%s woke %d for %v; want %v", op, want, got, wk)
			}
			m.drop(want)
			ws[want].queued = false
			ws[want].woken = true
			ws[want].by = wk
		}
	}
	check := func() {
		t.Helper()
		n := 0
		for _, w := range ws {
			if w.queued {
				n++
			}
		}
		inKeys := 0
		for k, l := range r.byKey {
			if l.Len() == 0 {
				fail("an empty queue kept for key %v", k)
			}
			inKeys += l.Len()
		}
		if int(r.n.Load()) != n || r.all.Len() != n || inKeys != n || len(m.queue) != n {
			fail("n=%d all=%d byKey=%d model=%d; want %d queued", r.n.Load(), r.all.Len(), inKeys, len(m.queue), n)
		}
		if r.events.Load() != m.events {
			fail("events %d, model %d", r.events.Load(), m.events)
		}
		// The list's order is the model's.
		j := 0
		for e := r.all.Front(); e != nil; e = e.Next() {
			if e.Value.(*roomWaiter) != ws[m.queue[j]].rw.w {
				fail("queue order differs from the model's at %d", j)
			}
			j++
		}
	}
	// ask makes waiter i ask the pool and queue, as fullPause does, with an
	// event between the ask and the add sometimes.
	ask := func(i int) {
		w := ws[i]
		if w.woken {
			// fullPause: a woken waiter that found no room passes the
			// wake on if it may not evict.
			w.woken = false
			w.rw.woken = false
			if w.stuck && w.by.event == roomIdle && w.by.key != w.key {
				r.passOn(w.by)
				expect(fmt.Sprintf("passOn by stuck %d", i), m.passOn(ws, w.by), w.by)
			} else {
				consumed = true // found no room: the room is gone
			}
		}
		r.asking(&w.rw)
		w.seen = w.rw.seen
		if rng.IntN(5) == 0 {
			if rng.IntN(2) == 0 {
				wk := anyKey()
				r.signal(wk)
				m.events++
				globalEvent, consumed, lastWake = true, false, wk
				want := -1
				if len(m.queue) > 0 && ws[m.queue[0]].seen != m.events {
					want = m.queue[0]
				}
				expect("signal between ask and add", want, wk)
			} else {
				k := keys[rng.IntN(len(keys))]
				r.signalKey(k, 1, false)
				m.events++
				globalEvent = false
				expect("signalKey between ask and add", m.first(ws, func(x *adv71aW) bool { return x.key == k }), roomWake{roomStream, k})
			}
		}
		w.stuck = rng.IntN(3) == 0
		w.rw.stuck = w.stuck
		ch := r.add(&w.rw)
		if (ch == nil) != (m.events != w.seen) {
			fail("add of %d returned nil=%v with events %d, seen %d", i, ch == nil, m.events, w.seen)
		}
		if ch != nil {
			w.ch = ch
			w.queued = true
			m.queue = append(m.queue, i)
		}
		expect("add", -1, roomWake{})
	}
	for step := 0; step < steps; step++ {
		i := rng.IntN(nw)
		w := ws[i]
		switch op := rng.IntN(10); {
		case op < 3:
			// A waiter not paused asks and pauses.
			if w.queued {
				continue
			}
			w.rw.w = nil
			log = append(log, fmt.Sprintf("ask %d", i))
			ask(i)
		case op == 3:
			// A queued waiter's pause ends (timer, or ctx at the moment of
			// the wake): remove.
			if !w.queued {
				continue
			}
			log = append(log, fmt.Sprintf("remove %d", i))
			r.remove(&w.rw)
			w.queued = false
			m.drop(i)
			expect(fmt.Sprintf("remove %d", i), -1, roomWake{})
		case op == 4:
			// A woken waiter leaves without its wake (ctx ended as it was
			// delivered, or served elsewhere): the wake is passed on.
			if !w.woken {
				continue
			}
			log = append(log, fmt.Sprintf("leave-woken %d", i))
			w.woken = false
			if rng.IntN(2) == 0 && w.rw.w != nil {
				// ctx ended as the wake came: remove sees it closed.
				r.remove(&w.rw)
			} else {
				r.passOn(w.by)
			}
			expect(fmt.Sprintf("leave-woken %d", i), m.passOn(ws, w.by), w.by)
		case op == 5:
			// A woken waiter uses the room.
			if !w.woken {
				continue
			}
			log = append(log, fmt.Sprintf("use %d", i))
			consumed = true
			w.woken = false
			w.rw.w = nil
		case op == 6:
			wk := anyKey()
			r.signal(wk)
			m.events++
			log = append(log, fmt.Sprintf("signal %v", wk))
			globalEvent, consumed, lastWake = true, false, wk
			want := -1
			if len(m.queue) > 0 && ws[m.queue[0]].seen != m.events {
				want = m.queue[0]
			}
			expect("signal", want, wk)
		case op == 7:
			// A stream's end; with idle, the connection's last: if
			// none of its key waits, the oldest may evict it.
			k := keys[rng.IntN(len(keys))]
			idle := rng.IntN(2) == 0
			r.signalKey(k, 1, idle)
			m.events++
			log = append(log, fmt.Sprintf("signalKey %v idle %v", k.Lo, idle))
			want, wk := m.first(ws, func(x *adv71aW) bool { return x.key == k }), roomWake{roomStream, k}
			globalEvent = false
			if idle {
				wk = roomWake{roomIdle, k}
				globalEvent, consumed, lastWake = true, false, wk
				if want < 0 && len(m.queue) > 0 && ws[m.queue[0]].seen != m.events {
					want = m.queue[0]
				}
			}
			expect("signalKey", want, wk)
		case op == 8:
			k := keys[rng.IntN(len(keys))]
			wk := roomWake{roomEvent(rng.IntN(3)), k}
			r.passOn(wk)
			log = append(log, fmt.Sprintf("passOn %v", wk))
			expect("passOn", m.passOn(ws, wk), wk)
		default:
			// A woken waiter asks again.
			if !w.woken {
				continue
			}
			log = append(log, fmt.Sprintf("reask %d", i))
			w.rw.w = nil
			ask(i)
		}
		check()
		// No waiter that could use an event is left asleep while the
		// event was not consumed: after an event for any key, with no
		// wake outstanding and none used (or dropped by a waiter that
		// could look for room) since, no queued waiter that may evict has
		// missed it.
		outstanding := false
		for _, x := range ws {
			if x.woken {
				outstanding = true
			}
		}
		if globalEvent && !consumed && !outstanding {
			if j := m.first(ws, func(x *adv71aW) bool { return adv71aUsable(x, lastWake) }); j >= 0 {
				fail("event %d unconsumed, no wake outstanding, yet waiter %d (free, queued) has not seen it (it saw %d)", m.events, j, ws[j].seen)
			}
		}
	}
	// Everyone leaves.
	for i, w := range ws {
		if w.queued {
			r.remove(&w.rw)
			w.queued = false
			m.drop(i)
			// A remove of an unwoken waiter wakes nobody.
			expect("final remove", -1, roomWake{})
		}
	}
	check()
}
