package orbitpool

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestSetCapacityLowersRaisesAndDrains(t *testing.T) {
	backings(t, func(t *testing.T, p *Pool) {
		k := Key{7, 1}
		id, err := p.Register(k, 4)
		if err != nil {
			t.Fatal(err)
		}
		var held []*Execution
		for range 3 {
			l, err := p.Reserve(id)
			if err != nil {
				t.Fatal(err)
			}
			e, err := p.Accept(l)
			if err != nil {
				t.Fatal(err)
			}
			held = append(held, e)
		}
		// Lower below what is in use: nothing is taken back, nothing new
		// is granted.
		if err := p.SetCapacity(id, 2); err != nil {
			t.Fatal(err)
		}
		if c, err := p.Capacity(id); err != nil || c != 2 {
			t.Fatalf("Capacity = %d, %v; want 2", c, err)
		}
		if _, err := p.Reserve(id); !errors.Is(err, ErrBusy) {
			t.Fatalf("Reserve over the lowered capacity: %v, want ErrBusy", err)
		}
		held[0].Complete()
		held[1].Complete()
		// One user left, capacity 2: one more unit.
		l, err := p.Reserve(id)
		if err != nil {
			t.Fatalf("Reserve with room under the lowered capacity: %v", err)
		}
		if _, err := p.Reserve(id); !errors.Is(err, ErrBusy) {
			t.Fatalf("second Reserve at capacity: %v, want ErrBusy", err)
		}
		e, err := p.Accept(l)
		if err != nil {
			t.Fatal(err)
		}
		// Drain: a live resource with capacity 0 takes nothing.
		if err := p.SetCapacity(id, 0); err != nil {
			t.Fatal(err)
		}
		e.Complete()
		held[2].Complete()
		if _, err := p.Reserve(id); !errors.Is(err, ErrBusy) {
			t.Fatalf("Reserve on a drained resource: %v, want ErrBusy", err)
		}
		cands, _ := p.Candidates(k, nil)
		if len(cands) != 1 || cands[0].Capacity != 0 || cands[0].Room() != 0 {
			t.Fatalf("candidates of a drained resource: %+v", cands)
		}
		if p.Live(k) != 1 {
			t.Fatalf("a drained resource still counts: Live = %d, want 1", p.Live(k))
		}
		// A waiter parked on the drained key wakes when it is raised.
		got := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			plan, err := p.Acquire(ctx, k, LocalOnly{}, Limits{MaxResources: 1})
			if err == nil {
				plan.Execution.Complete()
			}
			got <- err
		}()
		waitFor(t, func() bool { s, _ := p.Snapshot(); return mpKS(s, k).Waiting == 1 })
		if err := p.SetCapacity(id, 3); err != nil {
			t.Fatal(err)
		}
		if err := <-got; err != nil {
			t.Fatalf("waiter on a drained resource after raising it: %v", err)
		}
		// Errors: range, stale, another lane's.
		if err := p.SetCapacity(id, MaxCapacity+1); err == nil {
			t.Fatal("capacity over MaxCapacity accepted")
		}
		if err := p.SetCapacity(id, -1); err == nil {
			t.Fatal("negative capacity accepted")
		}
		if err := p.Unregister(id); err != nil {
			t.Fatal(err)
		}
		if err := p.SetCapacity(id, 2); !errors.Is(err, ErrStale) {
			t.Fatalf("SetCapacity of an unregistered resource: %v, want ErrStale", err)
		}
		if _, err := p.Capacity(id); !errors.Is(err, ErrStale) {
			t.Fatalf("Capacity of an unregistered resource: %v, want ErrStale", err)
		}
	})
}

func TestSetCapacityNotOwner(t *testing.T) {
	ps := openShared(t, small, 2)
	id, err := ps[0].Register(Key{7, 2}, 2)
	if err != nil {
		t.Fatal(err)
	}
	if err := ps[1].SetCapacity(id, 1); !errors.Is(err, ErrNotOwner) {
		t.Fatalf("SetCapacity from another lane: %v, want ErrNotOwner", err)
	}
	if c, err := ps[1].Capacity(id); err != nil || c != 2 {
		t.Fatalf("Capacity read from another lane = %d, %v; want 2", c, err)
	}
}

// TestSetCapacityBoundsGrantsUnderChurn changes a resource's capacity while
// goroutines on two lanes take it (locally and by lease) as fast as they can.
// Each grant is tagged with the capacity epoch current before it began; the
// grants of the current epoch in flight at once never exceed its capacity.
func TestSetCapacityBoundsGrantsUnderChurn(t *testing.T) {
	// Every lease is accepted, and one refused as aged out is an error.
	ps := openSharedOpts(t, small, 2, noAging)
	owner, other := ps[0], ps[1]
	k := Key{7, 3}
	id, err := owner.Register(k, 8)
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu       sync.Mutex
		epoch    int
		capOf    = map[int]int{0: 8}
		inflight = map[int]int{}
		granted  atomic.Int64
		bad      atomic.Int64
	)
	epochNow := func() int { mu.Lock(); defer mu.Unlock(); return epoch }
	begin := func(e int) {
		mu.Lock()
		defer mu.Unlock()
		inflight[e]++
		if e == epoch && inflight[e] > capOf[e] {
			bad.Add(1)
			t.Errorf("epoch %d: %d grants in flight, capacity %d", e, inflight[e], capOf[e])
		}
	}
	end := func(e int) { mu.Lock(); inflight[e]--; mu.Unlock() }
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 1))
			for {
				select {
				case <-stop:
					return
				default:
				}
				e0 := epochNow()
				var ex *Execution
				if g%2 == 0 {
					plan, err := owner.Acquire(context.Background(), k, LocalOnly{}, Limits{MaxResources: 1})
					if err != nil || plan.Kind != PlanReuseLocal {
						// LocalOnly with a full budget waits; it never fails here.
						t.Errorf("local acquire: %v %v", plan.Kind, err)
						return
					}
					ex = plan.Execution
				} else {
					l, err := other.Reserve(id)
					if err != nil {
						if !errors.Is(err, ErrBusy) {
							t.Errorf("reserve: %v", err)
							return
						}
						time.Sleep(20 * time.Microsecond)
						continue
					}
					if ex, err = owner.Accept(l); err != nil {
						t.Errorf("accept: %v", err)
						return
					}
				}
				granted.Add(1)
				begin(e0)
				if rng.IntN(4) == 0 {
					time.Sleep(time.Duration(rng.IntN(200)) * time.Microsecond)
				}
				end(e0)
				ex.Complete()
			}
		}()
	}
	caps := []int{0, 1, 2, 3, 5, 8}
	rng := rand.New(rand.NewPCG(9, 9))
	deadline := time.Now().Add(400 * time.Millisecond)
	changes := 0
	for time.Now().Before(deadline) {
		c := caps[rng.IntN(len(caps))]
		if changes%5 == 4 {
			c = 0 // drains, and the raise after it must wake the parked
		}
		// The change and its epoch are one step for the workers: a grant
		// that reads the new capacity is never counted under the old epoch.
		mu.Lock()
		err := owner.SetCapacity(id, c)
		epoch++
		capOf[epoch] = c
		mu.Unlock()
		if err != nil {
			t.Fatal(err)
		}
		changes++
		time.Sleep(2 * time.Millisecond)
	}
	mu.Lock()
	if err := owner.SetCapacity(id, 8); err != nil { // release everyone parked
		t.Fatal(err)
	}
	epoch++
	capOf[epoch] = 8
	mu.Unlock()
	close(stop)
	wg.Wait()
	if granted.Load() < int64(changes) {
		t.Errorf("only %d grants over %d capacity changes: the workers starved", granted.Load(), changes)
	}
	s, _ := owner.Snapshot()
	if ks := mpKS(s, k); ks.InUse != 0 || ks.Pending != 0 {
		t.Errorf("after the run: %+v, want nothing in use or pending", ks)
	}
	t.Logf("%d grants over %d capacity changes", granted.Load(), changes)
}

// hookGrantOnce puts f in the window between a grant's read of the capacity
// and its compare-and-swap, for the first grant only.
func hookGrantOnce(t *testing.T, f func(ResourceID)) {
	t.Helper()
	var once sync.Once
	h := func(id ResourceID) { once.Do(func() { f(id) }) }
	testHookGrant.Store(&h)
	t.Cleanup(func() { testHookGrant.Store(nil) })
}

// TestSetCapacityInGrantWindow lowers a resource's capacity exactly between
// a grant's read of the capacity and its compare-and-swap, for a Reserve by
// another lane and for a local use: the grant saw room under the old
// capacity, and only the re-check after the swap can refuse it.
func TestSetCapacityInGrantWindow(t *testing.T) {
	for _, local := range []bool{false, true} {
		name := "reserve"
		if local {
			name = "local"
		}
		t.Run(name, func(t *testing.T) {
			ps := openShared(t, small, 2)
			owner, other := ps[0], ps[1]
			k := Key{7, 4}
			id, err := owner.Register(k, 4)
			if err != nil {
				t.Fatal(err)
			}
			for range 2 {
				l, err := other.Reserve(id)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := owner.Accept(l); err != nil {
					t.Fatal(err)
				}
			}
			hooked := false
			hookGrantOnce(t, func(got ResourceID) {
				hooked = got == id
				if err := owner.SetCapacity(id, 2); err != nil {
					t.Error(err)
				}
			})
			if local {
				ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
				defer cancel()
				plan, err := owner.Acquire(ctx, k, LocalOnly{}, Limits{MaxResources: 1})
				var we *WaitError
				if !errors.As(err, &we) {
					t.Errorf("local use with 2 in use and the capacity lowered to 2 in its window: plan %v, err %v; want a wait that times out", plan.Kind, err)
				}
			} else if l, err := other.Reserve(id); !errors.Is(err, ErrBusy) {
				t.Errorf("Reserve with 2 in use and the capacity lowered to 2 in its window: lease %+v, err %v; want ErrBusy", l, err)
			}
			if !hooked {
				t.Fatal("the grant never ran the hook")
			}
			c, _ := owner.Candidates(k, nil)
			if len(c) != 1 || c[0].InUse+c[0].Pending != 2 || c[0].Capacity != 2 {
				t.Errorf("after the grant: %+v, want capacity 2 with 2 in use and nothing pending", c)
			}
		})
	}
}

// TestUsers: Users counts a resource's accepted users and its pending
// reservations, and refuses a resource that has gone.
func TestUsers(t *testing.T) {
	backings(t, func(t *testing.T, p *Pool) {
		id, err := p.Register(Key{7, 2}, 4)
		if err != nil {
			t.Fatal(err)
		}
		users := func(want int) {
			t.Helper()
			if n, err := p.Users(id); err != nil || n != want {
				t.Fatalf("Users = %d, %v; want %d", n, err, want)
			}
		}
		users(0)
		l, err := p.Reserve(id)
		if err != nil {
			t.Fatal(err)
		}
		users(1) // pending
		e, err := p.Accept(l)
		if err != nil {
			t.Fatal(err)
		}
		users(1)
		l2, err := p.Reserve(id)
		if err != nil {
			t.Fatal(err)
		}
		users(2)
		p.Withdraw(l2)
		e.Complete()
		users(0)
		if err := p.Unregister(id); err != nil {
			t.Fatal(err)
		}
		if _, err := p.Users(id); !errors.Is(err, ErrStale) {
			t.Fatalf("Users of an unregistered resource: %v, want ErrStale", err)
		}
	})
}
