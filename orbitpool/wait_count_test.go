package orbitpool

import (
	"sync/atomic"
	"testing"
)

// checkWaiterQueues checks what sync counts rather than walks against a walk
// of every local queue: the count of granted waiters, and, when no grant is
// pending, the waiting count and oldest waiting ticket it published.
func checkWaiterQueues(t *testing.T, step int, ps []*Pool) {
	t.Helper()
	for _, p := range ps {
		wt := &p.waiters
		wt.mu.Lock()
		for k, kw := range wt.keys {
			granted, waiting := 0, 0
			var oldest uint64
			for _, w := range kw.q {
				if w.granted {
					granted++
					continue
				}
				if waiting == 0 {
					oldest = w.ticket
				}
				waiting++
			}
			q := atomic.LoadUint64(p.seg.u64(p.seg.queueOff(p.lane, k)))
			switch {
			case granted != kw.granted:
				t.Errorf("step %d: lane %d key %d: %d waiters granted, counted %d", step, p.lane, k, granted, kw.granted)
			case qGrants(q) > 0:
			case qWaiting(q) != waiting:
				t.Errorf("step %d: lane %d key %d: %d waiting, published %d", step, p.lane, k, waiting, qWaiting(q))
			case waiting > 0 && qTicket(q) != uint32(oldest):
				t.Errorf("step %d: lane %d key %d: oldest waiting ticket %d, published %d", step, p.lane, k, oldest, qTicket(q))
			}
		}
		wt.mu.Unlock()
	}
}

// TestSyncHeldBehindTryingWaiters: sync stops walking a key's queue once it
// has seen what it publishes. A waiter granted a unit it has not taken yet is
// one of those things even when three older waiters, which took theirs and
// are trying, stand before it: the held word must name it, or a younger
// waiter of another process would take the unit on its way to it.
func TestSyncHeldBehindTryingWaiters(t *testing.T) {
	p := openMem(t, small)
	ref, err := p.internKey(Key{0x5e1d, 1})
	if err != nil {
		t.Fatal(err)
	}
	ws := make([]*waiter, 4)
	for i := range ws {
		if ws[i], err = p.waiters.register(p, ref); err != nil {
			t.Fatal(err)
		}
		defer p.waiters.leave(p, ws[i], false)
	}
	s := p.seg
	qw := s.u64(s.queueOff(p.lane, ref.idx))
	atomic.AddUint64(qw, 4) // four grants, as grantLanes adds them
	p.waiters.deliver(p, ref.idx)
	for _, w := range ws[:3] {
		if _, ok := p.waiters.take(p, w); !ok {
			t.Fatal("a waiter delivered a grant found none to take")
		}
	}
	checkWaiterQueues(t, 0, []*Pool{p})
	got := atomic.LoadUint64(s.u64(s.queueOff(p.lane, ref.idx) + qHeldOff))
	if want := heldWord(ws[3].ticket); got&(1<<qHeldVerShift-1) != want {
		t.Fatalf("held word %#x, want %#x: the granted waiter behind three trying ones", got, want)
	}
}
