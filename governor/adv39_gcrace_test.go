package governor

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestAdv39GCRacesAcquireRelease(t *testing.T) {
	const workers = 8
	g := New(workers, 1<<20)
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
	for k := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 3000 {
				ls, err := g.AcquireManyContext(context.Background(), 1+i%3, 1<<16)
				if err != nil {
					t.Error(err)
					return
				}
				if n := inUse.Add(int64(ls.Workers())); n > workers {
					over.Add(1)
				}
				cp := *ls
				if i%5 == 0 {
					inner, _ := g.AcquireManyContext(WithLease(context.Background(), &cp), 3, 1<<16)
					inner.Release()
				}
				if (i+k)%7 == 0 {
					runtime.Gosched()
				}
				inUse.Add(-int64(ls.Workers()))
				switch i % 3 {
				case 0:
					ls.Release()
					cp.Release()
				case 1:
					cp.Release()
					ls.Release()
				default:
					ls.Release()
					ls.Release()
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
		t.Errorf("%d workers exceeded %d times", workers, over.Load())
	}
	if o, r, lk := g.Outstanding(), g.ReservedBytes(), g.Leaked(); o != 0 || r != 0 || lk != 0 {
		t.Errorf("after every lease released: Outstanding %d, Reserved %d, Leaked %d; want 0, 0, 0", o, r, lk)
	}
}

func TestAdv39LeakedCountsExactly(t *testing.T) {
	g := New(10000, 0)
	func() {
		for i := range 1000 {
			ls, ok := g.TryAcquireMany(2, 10)
			if !ok {
				t.Fatal("no grant")
			}
			if i%2 == 0 {
				ls.Release()
			}
		}
	}()
	deadline := time.Now().Add(5 * time.Second)
	for g.Outstanding() != 0 && time.Now().Before(deadline) {
		runtime.GC()
		time.Sleep(time.Millisecond)
	}
	if o, r, lk := g.Outstanding(), g.ReservedBytes(), g.Leaked(); o != 0 || r != 0 || lk != 500 {
		t.Errorf("500 of 1000 dropped: Outstanding %d, Reserved %d, Leaked %d; want 0, 0, 500", o, r, lk)
	}
}
