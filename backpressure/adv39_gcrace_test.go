package backpressure

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestAdv39GCRacesAcquireRelease: with the collector running in a loop,
// permits acquired, copied, released (some twice, some through a copy after
// the original) across many batches never exceed the cap, and none is
// reported leaked: every one was released.
func TestAdv39GCRacesAcquireRelease(t *testing.T) {
	const capN = 8
	l := New(WithCap(capN))
	stop := make(chan struct{})
	var gcwg sync.WaitGroup
	gcwg.Add(1)
	go func() {
		defer gcwg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			runtime.GC()
		}
	}()
	var inUse, over atomic.Int64
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 3000 {
				pm, err := l.Acquire(context.Background())
				if err != nil {
					t.Error(err)
					return
				}
				if n := inUse.Add(1); n > capN {
					over.Add(1)
				}
				cp := *pm
				if (i+g)%7 == 0 {
					runtime.Gosched()
				}
				inUse.Add(-1)
				switch i % 3 {
				case 0:
					pm.Release()
					cp.Release()
				case 1:
					cp.Release()
					pm.Release()
				default:
					pm.Release()
					pm.Release()
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	gcwg.Wait()
	for range 5 {
		runtime.GC()
		time.Sleep(time.Millisecond)
	}
	if over.Load() != 0 {
		t.Errorf("cap %d exceeded %d times", capN, over.Load())
	}
	if a, lk := l.Active(), l.Leaked(); a != 0 || lk != 0 {
		t.Errorf("after every permit released: Active %d, Leaked %d; want 0, 0", a, lk)
	}
}

// TestAdv39LeakedCountsExactly: permits dropped without Release, across
// several batches, are all returned and counted once each; released ones are
// not counted.
func TestAdv39LeakedCountsExactly(t *testing.T) {
	l := New(WithCap(10000))
	func() {
		for i := range 1000 {
			pm, err := l.TryAcquire(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if i%2 == 0 {
				pm.Release()
			}
		}
	}()
	deadline := time.Now().Add(5 * time.Second)
	for l.Active() != 0 && time.Now().Before(deadline) {
		runtime.GC()
		time.Sleep(time.Millisecond)
	}
	if a, lk := l.Active(), l.Leaked(); a != 0 || lk != 500 {
		t.Errorf("500 of 1000 dropped: Active %d, Leaked %d; want 0, 500", a, lk)
	}
}
