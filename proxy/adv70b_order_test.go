package proxy

import (
	"sync"
	"testing"
	"time"
)

// TestAdv70bRoomWaitersNoLostWake: waiters that never find room (they ask,
// pause, and pass every wake on, as fullPause does) race signals from
// several goroutines. Once the signals stop and the waiters settle, every
// waiter must have asked after the last event: none is left queued with an
// event it never saw (a lost wake between its ask and its add, or a wake
// dropped on the way).
func TestAdv70bRoomWaitersNoLostWake(t *testing.T) {
	var r roomWaiters
	const waiters, signalers, events = 16, 4, 3000
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	last := make([]uint64, waiters) // events when each last asked
	for i := range waiters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var w roomWait
			for {
				r.asking(&w)
				mu.Lock()
				last[i] = w.seen
				mu.Unlock()
				if w.woken {
					w.woken = false
					r.passOn(w.by)
				}
				wake := r.add(&w)
				if wake == nil {
					continue
				}
				select {
				case <-wake:
					w.woken, w.by = true, w.w.by
				case <-stop:
					r.remove(&w)
					return
				}
			}
		}()
	}
	var sg sync.WaitGroup
	for range signalers {
		sg.Add(1)
		go func() {
			defer sg.Done()
			for range events / signalers {
				r.signal(roomWake{event: roomIdle})
			}
		}()
	}
	sg.Wait()
	final := r.events.Load()
	settled := func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, s := range last {
			if s != final {
				return false
			}
		}
		return r.n.Load() == waiters
	}
	deadline := time.Now().Add(5 * time.Second)
	for !settled() && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	ok := settled()
	mu.Lock()
	snapshot := append([]uint64(nil), last...)
	mu.Unlock()
	close(stop)
	wg.Wait()
	if !ok {
		t.Fatalf("after %d events, waiters last asked at %v, %d queued: a wake was lost", final, snapshot, r.n.Load())
	}
	if r.n.Load() != 0 || r.all.Len() != 0 {
		t.Fatalf("%d counted, %d queued after all left", r.n.Load(), r.all.Len())
	}
}
