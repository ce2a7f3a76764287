package orbitpool

import (
	"context"
	"errors"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"
	"unsafe"
)

func advAcquire(t *testing.T, p *Pool, k Key) *Execution {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	plan, err := p.Acquire(ctx, k, LocalOnly{}, Limits{})
	if err != nil || plan.Kind != PlanReuseLocal {
		t.Fatalf("acquire %v: %v %v", k, plan.Kind, err)
	}
	return plan.Execution
}

// gcUntil runs the collector until cond holds or d passes.
func gcUntil(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for {
		runtime.GC()
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestAdvDroppedExecutionPinnedByLiveBatchmate: Executions are guarded a
// batch at a time, so a dropped Execution whose batch-mate is still held (a
// long-lived stream on another key, say) is not returned while that one is
// held, as Execution's doc says; it is, once the batch-mate is released.
func TestAdvDroppedExecutionPinnedByLiveBatchmate(t *testing.T) {
	backings(t, func(t *testing.T, p *Pool) {
		kKeep, kDrop := Key{0xad6, 1}, Key{0xad6, 2}
		if _, err := p.Register(kKeep, 100); err != nil {
			t.Fatal(err)
		}
		if _, err := p.Register(kDrop, 100); err != nil {
			t.Fatal(err)
		}
		var keep *Execution
		for range 200 {
			k := advAcquire(t, p, kKeep)
			d := advAcquire(t, p, kDrop)
			if uintptr(unsafe.Pointer(d))-uintptr(unsafe.Pointer(k)) == unsafe.Sizeof(Execution{}) {
				keep = k
				break // d is dropped here, k is kept
			}
			k.Complete()
			d.Complete()
		}
		if keep == nil {
			t.Fatal("never got two Executions from one batch")
		}
		if gcUntil(200*time.Millisecond, func() bool { return keyStats(t, p, kDrop).InUse == 0 }) {
			t.Fatal("the dropped Execution was returned while its batch-mate is held: the batch no longer pins it, update Execution's doc")
		}
		keep.Complete()
		keep = nil
		before := p.LeakedGuards()
		if !gcUntil(5*time.Second, func() bool { p.Reconcile(); return keyStats(t, p, kDrop).InUse == 0 }) {
			t.Errorf("a dropped Execution was not returned once its batch-mate was released: key has %d in use, leaked guards %d -> %d",
				keyStats(t, p, kDrop).InUse, before, p.LeakedGuards())
		}
	})
}

// TestAdvGuardAccounting: many Executions and permits, some completed or
// closed (some twice), some registered, the rest dropped. After GC exactly
// the dropped ones are counted, nothing stays in use or creating, and the
// key's total counts exactly the registered resources.
func TestAdvGuardAccounting(t *testing.T) {
	backings(t, func(t *testing.T, p *Pool) {
		k := Key{0xad6, 3}
		kp := Key{0xad6, 4}
		if _, err := p.Register(k, 10000); err != nil {
			t.Fatal(err)
		}
		rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
		wantLeaked := 0
		registered := 0
		var regIDs []ResourceID
		func() {
			for range 1000 {
				e := advAcquire(t, p, k)
				switch rng.IntN(3) {
				case 0:
					e.Complete()
				case 1:
					e.Complete()
					e.Close()
				default:
					wantLeaked++
				}
			}
			for range 12 {
				cp, err := p.ClaimCreate(kp, Limits{})
				if err != nil {
					t.Fatal(err)
				}
				switch rng.IntN(4) {
				case 0:
					cp.Close()
					cp.Close()
				case 1:
					id, err := cp.Register(1)
					if err != nil {
						t.Fatal(err)
					}
					regIDs = append(regIDs, id)
					registered++
					cp.Close() // after Register: nothing
				case 2:
					e, err := cp.RegisterAndAccept(1)
					if err != nil {
						t.Fatal(err)
					}
					e.Complete()
					regIDs = append(regIDs, e.ID())
					registered++
				default:
					wantLeaked++
				}
			}
		}()
		if !gcUntil(5*time.Second, func() bool { return p.LeakedGuards() >= uint64(wantLeaked) }) {
			t.Fatalf("after GCs, %d leaked guards counted, want %d", p.LeakedGuards(), wantLeaked)
		}
		time.Sleep(50 * time.Millisecond)
		runtime.GC()
		if got := p.LeakedGuards(); got != uint64(wantLeaked) {
			t.Fatalf("%d leaked guards counted, want exactly %d (completed, closed and registered guards must not count)", got, wantLeaked)
		}
		if ks := keyStats(t, p, k); ks.InUse != 0 || ks.Pending != 0 {
			t.Fatalf("use key after GC: %+v", ks)
		}
		ks := keyStats(t, p, kp)
		if ks.Creating != 0 || ks.Live != registered || ks.InUse != 0 {
			t.Fatalf("permit key after GC: %+v, want %d live, nothing creating or in use", ks, registered)
		}
		for _, id := range regIDs {
			if err := p.Unregister(id); err != nil {
				t.Fatal(err)
			}
		}
		if ks := keyStats(t, p, kp); ks.Live != 0 || ks.Creating != 0 {
			t.Fatalf("after unregistering all: %+v", ks)
		}
	})
}

// TestAdvGuardDroppedAfterCloseDoesNothing: guards of a closed pool, dropped,
// neither count nor touch the lane's next owner, which reuses the slots.
func TestAdvGuardDroppedAfterCloseDoesNothing(t *testing.T) {
	spec := PoolSpec{Lanes: 2, Keys: 8, ResourcesPerLane: 8, Path: t.TempDir() + "/seg"}
	k := Key{0xad6, 5}
	a, err := Open(spec, testOpts)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Register(k, 4); err != nil {
		t.Fatal(err)
	}
	func() {
		for range 3 {
			advAcquire(t, a, k)
		}
		if _, err := a.ClaimCreate(k, Limits{}); err != nil {
			t.Fatal(err)
		}
	}()
	a.Close()
	b, err := Open(spec, testOpts)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	var held []*Execution
	for range 4 {
		if _, err := b.Register(k, 1); err != nil {
			t.Fatal(err)
		}
	}
	for range 4 {
		held = append(held, advAcquire(t, b, k))
	}
	for range 10 {
		runtime.GC()
		time.Sleep(5 * time.Millisecond)
	}
	if a.LeakedGuards() != 0 {
		t.Errorf("closed pool counted %d leaked guards", a.LeakedGuards())
	}
	if ks := keyStats(t, b, k); ks.InUse != 4 || ks.Live != 4 || ks.Creating != 0 {
		t.Errorf("next owner's key after the closed pool's guards were collected: %+v, want 4 live, 4 in use", ks)
	}
	for _, e := range held {
		e.Complete()
	}
	if _, err := b.ClaimCreate(k, Limits{MaxResources: 4}); !errors.Is(err, ErrBudget) {
		t.Errorf("claim over budget: %v", err)
	}
}
