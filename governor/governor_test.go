package governor

import (
	"context"
	"errors"
	"math"
	"sync"
	"testing"
	"testing/synctest"
)

// checkIdle fails the test if g still has workers, bytes or waiters
// outstanding: the leak check every test ends with.
func checkIdle(t *testing.T, g *Governor) {
	t.Helper()
	if n := g.Outstanding(); n != 0 {
		t.Errorf("Outstanding = %d after all leases released, want 0", n)
	}
	if b := g.ReservedBytes(); b != 0 {
		t.Errorf("ReservedBytes = %d after all leases released, want 0", b)
	}
	if w := g.waiting(); w != 0 {
		t.Errorf("%d waiters left queued, want 0", w)
	}
}

func TestAcquireManyGrant(t *testing.T) {
	tests := []struct {
		name        string
		workers     int
		limit       uint64
		holdWorkers int    // taken first, with holdPer bytes each
		holdPer     uint64 //
		want        int
		per         uint64
		wantWorkers int
		wantBytes   uint64
	}{
		{name: "fits", workers: 8, limit: 1000, want: 4, per: 100, wantWorkers: 4, wantBytes: 400},
		{name: "capped by free workers", workers: 8, limit: 1 << 20, holdWorkers: 6, want: 4, per: 10, wantWorkers: 2, wantBytes: 20},
		{name: "capped by free memory", workers: 8, limit: 1000, want: 8, per: 300, wantWorkers: 3, wantBytes: 900},
		{name: "memory shared with holder", workers: 8, limit: 1000, holdWorkers: 1, holdPer: 600, want: 8, per: 100, wantWorkers: 4, wantBytes: 400},
		{name: "floor of one when memory is gone", workers: 8, limit: 1000, holdWorkers: 1, holdPer: 1000, want: 4, per: 100, wantWorkers: 1, wantBytes: 100},
		{name: "floor of one when one worker exceeds the limit", workers: 8, limit: 100, want: 2, per: 1000, wantWorkers: 1, wantBytes: 1000},
		{name: "want below one means one", workers: 8, limit: 1000, want: 0, per: 10, wantWorkers: 1, wantBytes: 10},
		{name: "no bytes ignores memory", workers: 8, limit: 1, holdWorkers: 1, holdPer: 1000, want: 5, wantWorkers: 5},
		{name: "no memory budget", workers: 4, limit: 0, want: 8, per: 1 << 40, wantWorkers: 4, wantBytes: 4 << 40},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := New(tt.workers, tt.limit)
			var hold *LeaseSet
			if tt.holdWorkers > 0 {
				hold = g.AcquireMany(tt.holdWorkers, tt.holdPer)
				if hold.Workers() != tt.holdWorkers {
					t.Fatalf("setup: held %d workers, want %d", hold.Workers(), tt.holdWorkers)
				}
			}
			ls := g.AcquireMany(tt.want, tt.per)
			if ls.Workers() != tt.wantWorkers || ls.Bytes() != tt.wantBytes {
				t.Errorf("AcquireMany(%d, %d) = %d workers, %d bytes; want %d, %d",
					tt.want, tt.per, ls.Workers(), ls.Bytes(), tt.wantWorkers, tt.wantBytes)
			}
			if got, want := g.Outstanding(), tt.holdWorkers+tt.wantWorkers; got != want {
				t.Errorf("Outstanding = %d, want %d", got, want)
			}
			ls.Release()
			hold.Release()
			checkIdle(t, g)
		})
	}
}

func TestNewClampsArguments(t *testing.T) {
	g := New(0, 0)
	if g.Workers() != 1 {
		t.Errorf("New(0, 0).Workers() = %d, want 1", g.Workers())
	}
	if g.MemoryLimit() != math.MaxUint64 {
		t.Errorf("New(0, 0).MemoryLimit() = %d, want no budget (MaxUint64)", g.MemoryLimit())
	}
}

// The over-commitment AcquireMany documents: eight concurrent callers each
// asking for one worker each floor to one and each charge their demand, so
// the reserved total reaches workers × perWorkerBytes, far past the limit,
// and the worker count is the only hard ceiling.
func TestOverCommitEightCallers(t *testing.T) {
	const workers, limit, per = 8, 100, 1000
	g := New(workers, limit)
	leases := make([]*LeaseSet, workers)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range leases {
		wg.Go(func() {
			<-start
			leases[i] = g.AcquireMany(1, per)
		})
	}
	close(start)
	wg.Wait()

	for i, ls := range leases {
		if ls.Workers() != 1 || ls.Bytes() != per {
			t.Errorf("caller %d got %d workers, %d bytes; want 1, %d", i, ls.Workers(), ls.Bytes(), per)
		}
	}
	if got, want := g.ReservedBytes(), uint64(workers*per); got != want {
		t.Errorf("ReservedBytes = %d, want workers × per = %d", got, want)
	}
	if g.ReservedBytes() <= g.MemoryLimit() {
		t.Errorf("ReservedBytes = %d, expected the floor grants to exceed the limit %d", g.ReservedBytes(), g.MemoryLimit())
	}
	if g.Outstanding() != workers {
		t.Errorf("Outstanding = %d, want %d", g.Outstanding(), workers)
	}
	if ls, ok := g.TryAcquireMany(1, per); ok {
		ls.Release()
		t.Error("a ninth grant succeeded: the worker count must be a hard ceiling")
	}
	for _, ls := range leases {
		ls.Release()
	}
	checkIdle(t, g)
}

func TestReleaseIsIdempotent(t *testing.T) {
	g := New(2, 1000)
	a := g.AcquireMany(1, 100)
	b := g.AcquireMany(1, 100)
	a.Release()
	a.Release()
	if g.Outstanding() != 1 || g.ReservedBytes() != 100 {
		t.Errorf("after double release of one lease: Outstanding %d, ReservedBytes %d; want 1, 100",
			g.Outstanding(), g.ReservedBytes())
	}
	b.Release()
	var nilLease *LeaseSet
	nilLease.Release() // must not panic
	checkIdle(t, g)
}

func TestTryAcquire(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := New(1, 0)
		first, ok := g.TryAcquire()
		if !ok || first.Workers() != 1 {
			t.Fatalf("TryAcquire on an idle governor = %v, %v; want one worker", first, ok)
		}
		if _, ok := g.TryAcquire(); ok {
			t.Fatal("TryAcquire succeeded with no worker free")
		}

		// A queued waiter has priority: a worker freed for it is not
		// available to TryAcquire.
		got := make(chan *LeaseSet)
		go func() { got <- g.Acquire() }()
		synctest.Wait()
		if g.waiting() != 1 {
			t.Fatalf("waiting = %d, want the blocked Acquire queued", g.waiting())
		}
		first.Release()
		if ls, ok := g.TryAcquire(); ok {
			ls.Release()
			t.Error("TryAcquire took the worker released to a queued waiter")
		}
		(<-got).Release()
		checkIdle(t, g)
	})
}

func TestAcquireBlocksOnlyWhileNoWorkerIsFree(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := New(2, 100)
		hold := g.AcquireMany(2, 0)
		got := make(chan *LeaseSet, 1)
		go func() { got <- g.AcquireMany(4, 1000) }()
		synctest.Wait()
		select {
		case ls := <-got:
			t.Fatalf("AcquireMany returned %d workers with none free", ls.Workers())
		default:
		}
		hold.Release()
		ls := <-got
		// Both workers are free by now, but memory allows none: the floor.
		if ls.Workers() != 1 || ls.Bytes() != 1000 {
			t.Errorf("woken waiter got %d workers, %d bytes; want the floor 1, 1000", ls.Workers(), ls.Bytes())
		}
		ls.Release()
		checkIdle(t, g)
	})
}

func TestWaitersServedInArrivalOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := New(1, 0)
		hold := g.Acquire()
		const n = 5
		order := make(chan int, n)
		for i := range n {
			go func() {
				ls := g.Acquire()
				order <- i
				ls.Release()
			}()
			synctest.Wait() // i is queued before i+1 arrives
		}
		hold.Release()
		for want := range n {
			if got := <-order; got != want {
				t.Fatalf("waiter %d served in position %d", got, want)
			}
		}
		synctest.Wait() // the last waiter releases after it reports
		checkIdle(t, g)
	})
}

func TestAcquireManyContext(t *testing.T) {
	t.Run("done before the call", func(t *testing.T) {
		g := New(1, 0)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if ls, err := g.AcquireManyContext(ctx, 1, 0); !errors.Is(err, context.Canceled) || ls != nil {
			t.Errorf("AcquireManyContext(cancelled) = %v, %v; want nil, context.Canceled", ls, err)
		}
		checkIdle(t, g)
	})
	t.Run("wait ends with the context", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			g := New(1, 0)
			hold := g.Acquire()
			ctx, cancel := context.WithCancel(context.Background())
			errc := make(chan error)
			go func() {
				_, err := g.AcquireManyContext(ctx, 1, 0)
				errc <- err
			}()
			synctest.Wait()
			cancel()
			if err := <-errc; !errors.Is(err, context.Canceled) {
				t.Errorf("err = %v, want context.Canceled", err)
			}
			if g.waiting() != 0 {
				t.Errorf("cancelled waiter still queued")
			}
			hold.Release()
			checkIdle(t, g)
		})
	})
	t.Run("a cancelled waiter does not block those behind it", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			g := New(1, 0)
			hold := g.Acquire()
			ctx, cancel := context.WithCancel(context.Background())
			go g.AcquireManyContext(ctx, 1, 0)
			synctest.Wait()
			got := make(chan *LeaseSet)
			go func() { got <- g.Acquire() }()
			synctest.Wait()
			cancel()
			synctest.Wait()
			hold.Release()
			(<-got).Release()
			checkIdle(t, g)
		})
	})
}

func TestWorkersForReservesNothing(t *testing.T) {
	g := New(8, 1000)
	hold := g.AcquireMany(2, 250) // 6 workers and 500 bytes free
	tests := []struct {
		per  uint64
		want int
	}{
		{per: 0, want: 6},
		{per: 50, want: 6},
		{per: 100, want: 5},
		{per: 250, want: 2},
		{per: 10000, want: 1}, // never below the floor a grant would give
	}
	for _, tt := range tests {
		if got := g.WorkersFor(tt.per); got != tt.want {
			t.Errorf("WorkersFor(%d) = %d, want %d", tt.per, got, tt.want)
		}
		if got := g.WorkersFor(tt.per); got != tt.want {
			t.Errorf("second WorkersFor(%d) = %d, want the same %d: it must reserve nothing", tt.per, got, tt.want)
		}
	}
	if g.Outstanding() != 2 || g.ReservedBytes() != 500 {
		t.Errorf("WorkersFor changed the reservation: Outstanding %d, ReservedBytes %d", g.Outstanding(), g.ReservedBytes())
	}
	hold.Release()
	checkIdle(t, g)
}

func TestTryAcquireMany(t *testing.T) {
	g := New(4, 1000)
	a, ok := g.TryAcquireMany(3, 200)
	if !ok || a.Workers() != 3 || a.Bytes() != 600 {
		t.Fatalf("TryAcquireMany(3, 200) = %v, %v", a, ok)
	}
	b, ok := g.TryAcquireMany(3, 1000)
	if !ok || b.Workers() != 1 || b.Bytes() != 1000 {
		t.Fatalf("TryAcquireMany(3, 1000) with one worker and 400 bytes free = %v, %v; want the floor", b, ok)
	}
	if _, ok := g.TryAcquireMany(1, 0); ok {
		t.Fatal("TryAcquireMany succeeded with no worker free")
	}
	a.Release()
	b.Release()
	checkIdle(t, g)
}

// A grant made to a waiter at the moment its context ends is either returned
// to it or passed to the next waiter, never lost. Which of the two happens
// depends on scheduling; the test repeats to see both, and the assertions
// hold for either.
func TestGrantRacingCancellationIsNotLost(t *testing.T) {
	for range 50 {
		synctest.Test(t, func(t *testing.T) {
			g := New(1, 1000)
			hold := g.AcquireMany(1, 500)
			ctx, cancel := context.WithCancel(context.Background())
			type result struct {
				ls  *LeaseSet
				err error
			}
			first := make(chan result, 1)
			go func() {
				ls, err := g.AcquireManyContext(ctx, 1, 500)
				first <- result{ls, err}
			}()
			synctest.Wait()
			second := make(chan *LeaseSet, 1)
			go func() { second <- g.AcquireMany(1, 500) }()
			synctest.Wait()

			cancel()
			hold.Release()
			r := <-first
			if r.err != nil && !errors.Is(r.err, context.Canceled) {
				t.Fatalf("first waiter: %v", r.err)
			}
			r.ls.Release()
			(<-second).Release() // a lost grant would deadlock here
			checkIdle(t, g)
		})
	}
}
