package orbitpool

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestAdv2HeldMoveSeenInNeitherWord: sync moves a waiter between the lane's
// queue word and its held word, and says that "a sibling reading them in
// between never finds it in neither". That holds for a delivery (waiting to
// held) but not for a take (held back to waiting, which every woken Acquire
// does before it tries): sync stores the held word (still naming the
// waiter), swaps the queue word (now counting it as waiting), then clears the
// held word; eligible reads the queue word first and the held word second.
// A sibling whose first read comes before the swap and whose second comes
// after the clear finds the older waiter in neither word, is eligible, and
// takes the unit the older waiter is just about to try for.
//
// Lane a's waiter X (older) is moved back and forth between held and waiting
// exactly as the dispatcher and Acquire move it (a grant added to the queue
// word and delivered, then take); lane b's waiter Y (younger) asks eligible
// all along. X is always either waiting or held, and the key has no
// unclaimed units, so eligible(Y) must never be true.
func TestAdv2HeldMoveSeenInNeitherWord(t *testing.T) {
	if runtime.GOMAXPROCS(0) < 2 {
		t.Skip("needs two threads running at once")
	}
	ps := openShared(t, small, 2)
	a, b := ps[0], ps[1]
	k := Key{0xad2e, 2}
	ref, err := a.internKey(k)
	if err != nil {
		t.Fatal(err)
	}
	x, err := a.waiters.register(a, ref)
	if err != nil {
		t.Fatal(err)
	}
	y, err := b.waiters.register(b, ref)
	if err != nil {
		t.Fatal(err)
	}
	defer b.waiters.leave(b, y, false)
	defer a.waiters.leave(a, x, false)
	if !ticketBefore(uint32(x.ticket), uint32(y.ticket)) {
		t.Fatalf("tickets %d, %d: want x older", x.ticket, y.ticket)
	}
	s := a.seg
	unclaimed := s.u64(s.keyOff(ref.idx) + kfUnclaimed)
	qw := s.u64(s.queueOff(a.lane, ref.idx))

	var (
		stop     atomic.Bool
		moves    atomic.Int64
		checks   atomic.Int64
		bad      atomic.Int64
		firstBad atomic.Value
		wg       sync.WaitGroup
	)
	wg.Add(2)
	go func() { // lane a: X held, then taken, again and again
		defer wg.Done()
		for !stop.Load() {
			// A sibling's grant to X's lane, as grantLanes adds it.
			for {
				q := atomic.LoadUint64(qw)
				if qGrants(q) > 0 || qWaiting(q) == 0 {
					break // the dispatcher has it already, or X holds one
				}
				if atomic.CompareAndSwapUint64(qw, q, q+1) {
					break
				}
			}
			a.waiters.deliver(a, ref.idx)
			if _, ok := a.waiters.take(a, x); !ok {
				stop.Store(true)
				firstBad.CompareAndSwap(nil, "take found no grant")
				return
			}
			moves.Add(1)
		}
	}()
	go func() { // lane b: Y asks whether it may try
		defer wg.Done()
		for !stop.Load() {
			if atomic.LoadUint64(unclaimed) != 0 {
				stop.Store(true)
				firstBad.CompareAndSwap(nil, "the key counts unclaimed units: the test is void")
				return
			}
			if b.waiters.eligible(b, y) {
				if bad.Add(1) == 1 {
					firstBad.CompareAndSwap(nil, fmt.Sprintf("after %d moves of X: eligible(Y) with X (ticket %d) older and waiting or held", moves.Load(), x.ticket))
				}
				if bad.Load() >= 20 {
					stop.Store(true)
				}
			}
			checks.Add(1)
		}
	}()
	deadline := time.Now().Add(8 * time.Second)
	for !stop.Load() && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	stop.Store(true)
	wg.Wait()
	t.Logf("%d moves of X, %d checks of Y", moves.Load(), checks.Load())
	if v := firstBad.Load(); v != nil {
		t.Fatalf("%s; %d times in all", v, bad.Load())
	}
}
