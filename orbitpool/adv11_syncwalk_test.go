package orbitpool

import (
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
)

// TestAdv11SyncMatchesWalk drives one process's waiter table directly
// (register, grants added to the lane's word and delivered, grants passed
// through wake, take, leave holding or not, an entry recycled under its
// waiters, and closeAll at the end) and after every step compares every
// word sync publishes with what a walk of the whole local queue gives: the
// count of granted waiters, the queue word (oldest waiting ticket, waiting
// count), the word of the second and third waiting tickets, the held word
// (the oldest granted waiter), the wait count and the mask bit. sync stops
// its walk early; whatever it skips must not change what it publishes.
func TestAdv11SyncMatchesWalk(t *testing.T) {
	for seed := range uint64(16) {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) { adv11SyncMatchesWalk(t, seed) })
	}
}

func adv11SyncMatchesWalk(t *testing.T, seed uint64) {
	p := openMem(t, small)
	stopDispatcher(p)
	rng := rand.New(rand.NewPCG(seed, 0xad11))
	s := p.seg
	var refs [2]keyRef
	for i := range refs {
		var err error
		if refs[i], err = p.internKey(Key{0xad11, uint64(i)}); err != nil {
			t.Fatal(err)
		}
	}
	var ws [2][]*waiter
	maxQ := 3 + int(seed%8)*2 // short queues and long ones
	for step := range 600 {
		i := rng.IntN(2)
		k := refs[i].idx
		switch op := rng.IntN(20); {
		case op < 6:
			if len(ws[i]) >= maxQ {
				break
			}
			w, err := p.waiters.register(p, refs[i])
			if err != nil {
				t.Fatalf("step %d: register: %v", step, err)
			}
			ws[i] = append(ws[i], w)
		case op < 8:
			// Grants another process added to this lane's word, as
			// grantLanes adds them, then delivered.
			if len(ws[i]) == 0 {
				break
			}
			atomic.AddUint64(s.u64(s.queueOff(p.lane, k)), uint64(1+rng.IntN(3)))
			p.waiters.deliver(p, k)
		case op < 10:
			// Units that came back, in strict order.
			p.wake(k, uint64(1+rng.IntN(3)))
		case op < 14:
			if len(ws[i]) == 0 {
				break
			}
			p.waiters.take(p, ws[i][rng.IntN(len(ws[i]))])
		case op < 19:
			if len(ws[i]) == 0 {
				break
			}
			j := rng.IntN(len(ws[i]))
			if rng.IntN(3) != 0 {
				j = 0 // the oldest leaves most often
			}
			p.waiters.leave(p, removeAt(&ws[i], j), rng.IntN(2) == 0)
		default:
			// The entry's earlier life: its waiters registered on a
			// generation the entry no longer has, and a newcomer
			// registers on the current one.
			p.waiters.mu.Lock()
			kw := p.waiters.keys[k]
			if kw != nil {
				kw.gen = refs[i].gen + 1
				for _, w := range kw.q {
					w.gen = kw.gen
				}
			}
			p.waiters.mu.Unlock()
			if kw == nil || len(ws[i]) >= maxQ {
				break
			}
			w, err := p.waiters.register(p, refs[i])
			if err != nil {
				t.Fatalf("step %d: register on a recycled entry: %v", step, err)
			}
			ws[i] = append(ws[i], w)
		}
		adv11CheckWalk(t, step, p, refs[:])
		if t.Failed() {
			return
		}
	}
	p.waiters.closeAll(p)
	adv11CheckWalk(t, -1, p, refs[:])
	for i := range ws {
		for _, w := range ws[i] {
			select {
			case <-w.ch:
			default:
				t.Errorf("a waiter on key %d was not woken by closeAll", i)
			}
			if _, ok := p.waiters.take(p, w); ok {
				t.Errorf("a waiter on key %d took a grant after closeAll", i)
			}
			p.waiters.leave(p, w, true)
		}
	}
	adv11CheckWalk(t, -2, p, refs[:])
}

// stopDispatcher ends p's dispatcher and leaves p open, for a test that
// drives the waiter table step by step and checks it between steps: the
// dispatcher's deliverAll passes surplus grants on after it lets go of the
// table's lock, and a check made meanwhile would see a grant it has added
// to the lane's word and not yet delivered. Close still works after it.
func stopDispatcher(p *Pool) {
	close(p.stop)
	p.ring(p.lane)
	futexWake(p.seg.u32(p.seg.laneOff(p.lane) + lnDoorbell))
	<-p.finished
	p.stop = make(chan struct{}) // for Close to close; finished stays closed
}

// adv11CheckWalk compares what sync published for each of refs with a walk
// of the local queue.
func adv11CheckWalk(t *testing.T, step int, p *Pool, refs []keyRef) {
	t.Helper()
	s := p.seg
	wt := &p.waiters
	wt.mu.Lock()
	defer wt.mu.Unlock()
	for _, ref := range refs {
		k := ref.idx
		off := s.queueOff(p.lane, k)
		q := atomic.LoadUint64(s.u64(off))
		third := atomic.LoadUint64(s.u64(off + 8))
		held := atomic.LoadUint64(s.u64(off+qHeldOff)) & (1<<qHeldVerShift - 1)
		count := atomic.LoadUint32(s.u32(s.waitOff(p.lane, k)))
		bit := atomic.LoadUint64(s.u64(s.maskOff(k, p.lane)))&laneBit(p.lane) != 0
		kw := wt.keys[k]
		if kw == nil {
			if bit || count != 0 || qWaiting(q) != 0 || qGrants(q) != 0 {
				t.Errorf("step %d: key %d has no local waiter; mask bit %v, wait count %d, queue word %#x", step, k, bit, count, q)
			}
			continue
		}
		var open []uint64
		granted := 0
		var wantHeld uint64
		for _, w := range kw.q {
			if w.granted {
				granted++
				if wantHeld == 0 {
					wantHeld = heldWord(w.ticket)
				}
				continue
			}
			open = append(open, w.ticket)
		}
		var next [3]uint64
		copy(next[:], open)
		wantQ := queueWord(next[0], len(open))
		wantThird := uint64(uint32(next[1])) | uint64(uint32(next[2]))<<32
		switch {
		case granted != kw.granted:
			t.Errorf("step %d: key %d: %d waiters granted, counted %d", step, k, granted, kw.granted)
		case !bit:
			t.Errorf("step %d: key %d has %d local waiters and no mask bit", step, k, len(kw.q))
		case int(count) != len(kw.q):
			t.Errorf("step %d: key %d: %d local waiters, wait count %d", step, k, len(kw.q), count)
		case qGrants(q) != 0 && len(open) > 0:
			t.Errorf("step %d: key %d: %d grants left undelivered with %d waiting", step, k, qGrants(q), len(open))
		case q&^uint64(1<<qUngShift-1) != wantQ:
			t.Errorf("step %d: key %d: queue word %#x, a walk gives %#x (waiting %d)", step, k, q, wantQ, len(open))
		case third != wantThird:
			t.Errorf("step %d: key %d: next-tickets word %#x, a walk gives %#x (waiting %v)", step, k, third, wantThird, open)
		case held != wantHeld:
			t.Errorf("step %d: key %d: held word %#x, a walk gives %#x", step, k, held, wantHeld)
		}
	}
}
