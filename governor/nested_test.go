package governor

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
)

// An outer unit that takes every worker and then has each of its workers ask
// the same governor for helpers must not deadlock: acquires under the outer
// lease borrow the worker they run on and never wait.
func TestNestedAcquireMakesProgress(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const workers = 4
		g := New(workers, 1<<20)
		outer := g.AcquireMany(workers, 1024)
		if outer.Workers() != workers {
			t.Fatalf("outer got %d workers, want all %d", outer.Workers(), workers)
		}
		ctx := WithLease(context.Background(), outer)
		var wg sync.WaitGroup
		for range outer.Workers() {
			wg.Go(func() {
				inner, err := g.AcquireManyContext(ctx, 8, 4096)
				if err != nil {
					t.Errorf("inner acquire: %v", err)
					return
				}
				defer inner.Release()
				if inner.Workers() != 1 || inner.Bytes() != 0 {
					t.Errorf("inner got %d workers, %d bytes; want only the borrowed worker, nothing charged",
						inner.Workers(), inner.Bytes())
				}
			})
		}
		wg.Wait() // a deadlock here fails the bubble
		if g.Outstanding() != workers {
			t.Errorf("Outstanding = %d: inner acquires must not charge the borrowed worker", g.Outstanding())
		}
		outer.Release()
		checkIdle(t, g)
	})
}

func TestNestedAcquireTakesOnlyFreeExtras(t *testing.T) {
	g := New(8, 0)
	outer := g.AcquireMany(2, 0)
	ctx := WithLease(context.Background(), outer)

	a, err := g.AcquireManyContext(ctx, 4, 0)
	if err != nil || a.Workers() != 4 || g.Outstanding() != 5 {
		t.Fatalf("first inner = %v, %v (Outstanding %d); want 1 borrowed + 3 extra, Outstanding 5", a, err, g.Outstanding())
	}
	b, err := g.AcquireManyContext(ctx, 8, 0)
	if err != nil || b.Workers() != 4 || g.Outstanding() != 8 {
		t.Fatalf("second inner = %v, %v (Outstanding %d); want 1 borrowed + the 3 left", b, err, g.Outstanding())
	}
	c, err := g.AcquireManyContext(ctx, 8, 0)
	if err != nil || c.Workers() != 1 {
		t.Fatalf("third inner with nothing free = %v, %v; want the borrowed worker alone", c, err)
	}
	for _, ls := range []*LeaseSet{c, b, a, outer} {
		ls.Release()
	}
	checkIdle(t, g)
}

// A lease released before the inner acquire no longer lends a worker: the
// caller holds nothing, so waiting is safe again.
func TestNestedUnderReleasedLeaseActsNormally(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := New(1, 0)
		outer := g.Acquire()
		ctx := WithLease(context.Background(), outer)
		outer.Release()
		other := g.Acquire()
		got := make(chan *LeaseSet)
		go func() {
			ls, _ := g.AcquireManyContext(ctx, 1, 0)
			got <- ls
		}()
		synctest.Wait()
		if g.waiting() != 1 {
			t.Fatalf("waiting = %d; an acquire under a released lease should queue", g.waiting())
		}
		other.Release()
		ls := <-got
		if ls.Workers() != 1 || g.Outstanding() != 1 {
			t.Errorf("got %d workers, Outstanding %d; want a charged worker", ls.Workers(), g.Outstanding())
		}
		ls.Release()
		checkIdle(t, g)
	})
}

// A lease of another governor lends nothing here.
func TestNestedOtherGovernorIgnored(t *testing.T) {
	g, other := New(2, 0), New(2, 0)
	outer := other.Acquire()
	ls, err := g.AcquireManyContext(WithLease(context.Background(), outer), 2, 0)
	if err != nil || ls.Workers() != 2 || g.Outstanding() != 2 {
		t.Errorf("got %v, %v (Outstanding %d); want 2 charged workers", ls, err, g.Outstanding())
	}
	ls.Release()
	outer.Release()
	checkIdle(t, g)
	checkIdle(t, other)
}
