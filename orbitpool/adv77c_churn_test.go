package orbitpool

import (
	"errors"
	"math/rand/v2"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestAdv77cClaimChurnWithReconcile: for 3s, 12 goroutines reserve the
// owner's resources from a sibling pool and have the owner accept them,
// 4 more reserve them from the owner itself and withdraw them (claims of
// the owner's own lane), each claim stalled 0-3ms after it is taken, while
// the dispatcher and a second goroutine run Reconcile every millisecond
// with a 1ms reservation timeout: the claim record's words are reused
// thousands of times, with several marks per word under way at once. An
// Accept whose claim was taken always returns an Execution (Reconcile never
// takes a live claim for a stray one), no slot is ever over its capacity,
// and at the end every unit is back, no ticket or claim is left, and the
// claim record is empty.
func TestAdv77cClaimChurnWithReconcile(t *testing.T) {
	const (
		slots    = 8
		capacity = 6
	)
	spec := PoolSpec{Lanes: 2, Keys: 4, ResourcesPerLane: slots, Path: filepath.Join(t.TempDir(), "seg")}
	opts := Options{ReconcileInterval: time.Millisecond, ReservationTimeout: time.Millisecond}
	owner := adv77aOpen(t, spec, opts)
	r := adv77aOpen(t, spec, opts)
	var ids []ResourceID
	for i := range slots {
		id, err := owner.Register(Key{0xa77c, 40 + uint64(i%4)}, capacity)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	var mu sync.Mutex
	tracked := map[int64]bool{} // goroutine -> its claim was taken
	h := func() {
		gid := adv77cGID()
		mu.Lock()
		_, ok := tracked[gid]
		if ok {
			tracked[gid] = true
		}
		mu.Unlock()
		if ok {
			time.Sleep(time.Duration(rand.IntN(3000)) * time.Microsecond)
		}
	}
	testHookClaimed.Store(&h)
	defer testHookClaimed.Store(nil)
	mon := adv77cWatch(owner, ids)
	defer mon.end(t)
	rec := adv77cReconcile(owner)
	defer rec.end()

	var stop atomic.Bool
	var accepted, stale, lost, withdrawn atomic.Int64
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			gid := adv77cGID()
			for !stop.Load() {
				id := ids[rand.IntN(len(ids))]
				if g < 12 {
					l, err := r.Reserve(id)
					if err != nil {
						time.Sleep(50 * time.Microsecond)
						continue
					}
					mu.Lock()
					tracked[gid] = false
					mu.Unlock()
					e, err := owner.Accept(l)
					mu.Lock()
					claimed := tracked[gid]
					delete(tracked, gid)
					mu.Unlock()
					switch {
					case err == nil:
						accepted.Add(1)
						e.Complete()
					case claimed:
						lost.Add(1)
						t.Errorf("an Accept whose claim was taken failed: %v", err)
					case errors.Is(err, ErrStale):
						stale.Add(1) // aged out before its claim
					default:
						t.Errorf("Accept: %v", err)
					}
					continue
				}
				l, err := owner.Reserve(id)
				if err != nil {
					time.Sleep(50 * time.Microsecond)
					continue
				}
				mu.Lock()
				tracked[gid] = false
				mu.Unlock()
				owner.Withdraw(l)
				mu.Lock()
				delete(tracked, gid)
				mu.Unlock()
				withdrawn.Add(1)
			}
		}()
	}
	time.Sleep(3 * time.Second)
	stop.Store(true)
	wg.Wait()
	rec.end()
	if n := rec.errs.Load(); n != 0 {
		t.Errorf("Reconcile failed %d time(s)", n)
	}
	if lost.Load() != 0 {
		t.Errorf("%d of %d claimed Accepts lost their reservation to Reconcile", lost.Load(), accepted.Load()+lost.Load())
	}
	if accepted.Load() == 0 || withdrawn.Load() == 0 {
		t.Errorf("no churn: %d accepted, %d withdrawn", accepted.Load(), withdrawn.Load())
	}
	testHookClaimed.Store(nil)
	// Reservations aged or withdrawn: settle with a few more rounds.
	for range 10 {
		owner.Reconcile()
		time.Sleep(2 * time.Millisecond)
	}
	mon.end(t)
	adv77cClaimsForgotten(t, owner)
	adv77cWhole(t, owner, r, ids, capacity)
	t.Logf("%d accepted, %d aged before their claim, %d own withdrawals", accepted.Load(), stale.Load(), withdrawn.Load())
}
