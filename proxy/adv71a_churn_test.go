package proxy

import (
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/orbitpool"
)

// TestAdv71aRoomWaitersConcurrentChurn: waiters of three keys, some that
// may not evict, pause as fullPause does with short random pauses that end
// by their timer, by a cancellation that races the wake, or by the wake;
// a woken waiter uses the wake, passes it on, or asks again. Signalers send
// signal and signalKey at the same time. Asserted: no waiter sees more wakes
// than events (room for n streams counting n) and passes made (each wakes at most one), no wake is seen
// twice, and once everyone has left, nothing is counted or queued (n, the
// list and byKey all empty).
func TestAdv71aRoomWaitersConcurrentChurn(t *testing.T) {
	var r roomWaiters
	keys := []orbitpool.Key{{Lo: 1}, {Lo: 2}, {Lo: 3}}
	const waiters, rounds = 24, 400
	var events, passes, woken atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := range waiters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(i), 99))
			w := roomWait{key: keys[i%len(keys)], stuck: i%4 == 0}
			for range rounds {
				r.asking(&w)
				if w.woken {
					w.woken = false
					if w.stuck && w.by.event == roomIdle && w.by.key != w.key {
						passes.Add(1)
						r.passOn(w.by)
					}
				}
				wake := r.add(&w)
				if wake == nil {
					continue
				}
				tm := time.NewTimer(time.Duration(rng.IntN(200)) * time.Microsecond)
				select {
				case <-wake:
					tm.Stop()
					woken.Add(1)
					w.by, w.w = w.w.by, nil
					switch rng.IntN(3) {
					case 0: // used it
					case 1: // left with it
						passes.Add(1)
						r.passOn(w.by)
					default:
						w.woken = true // asks again
					}
				case <-tm.C:
					// Timer, or a cancellation racing the wake: remove
					// passes a wake that came meanwhile on.
					rw := w.w
					r.remove(&w)
					select {
					case <-rw.wake:
						woken.Add(1)
						passes.Add(1)
					default:
					}
				case <-stop:
					tm.Stop()
					r.remove(&w)
					return
				}
			}
			if w.woken {
				passes.Add(1)
				r.passOn(w.by)
			}
		}()
	}
	var sg sync.WaitGroup
	for s := range 3 {
		sg.Add(1)
		go func() {
			defer sg.Done()
			rng := rand.New(rand.NewPCG(uint64(s), 7))
			for {
				select {
				case <-stop:
					return
				default:
				}
				switch rng.IntN(3) {
				case 0:
					events.Add(1)
					r.signal(roomWake{roomIdle, keys[rng.IntN(len(keys))]})
				case 1:
					events.Add(1)
					r.signal(roomWake{event: roomFree})
				default:
					n := 1 + rng.IntN(2) // room for n streams: n wakes
					events.Add(int64(n))
					r.signalKey(keys[rng.IntN(len(keys))], n, rng.IntN(2) == 0)
				}
				time.Sleep(time.Duration(rng.IntN(50)) * time.Microsecond)
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		close(stop)
		sg.Wait()
		t.Fatal("waiters did not finish their rounds")
	}
	close(stop)
	sg.Wait()
	if woken.Load() == 0 {
		t.Fatal("no waiter was ever woken")
	}
	if w, e, p := woken.Load(), events.Load(), passes.Load(); w > e+p {
		t.Fatalf("%d wakes seen for %d events and %d passes: some woke more than one waiter", w, e, p)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if n := r.n.Load(); n != 0 || r.all.Len() != 0 || len(r.byKey) != 0 {
		t.Fatalf("after everyone left: n=%d, %d queued, %d keys; want none", n, r.all.Len(), len(r.byKey))
	}
}
