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

// TestAdv76bClaimStressAging: reservers in several pools reserve, withdraw
// and have the owners accept (sometimes twice at once, sometimes racing a
// withdrawal) on a few resources whose reservations age in 2ms, while the
// owners' dispatchers reconcile every millisecond and one claim in five is
// held up between its two steps for several reservation timeouts. In every
// quiescent snapshot a resource's users are exactly the executions the test
// holds, and users plus pending reservations stay within capacity; no lease
// is accepted twice; and once every lease is over and aged, no ticket or
// claim is left on a slot and every resource serves its full capacity.
func TestAdv76bClaimStressAging(t *testing.T) {
	spec := PoolSpec{Lanes: 8, Keys: 2, ResourcesPerLane: 2, Path: filepath.Join(t.TempDir(), "seg")}
	const timeout = 2 * time.Millisecond
	open := opener(t, spec, Options{ReconcileInterval: time.Millisecond, ReservationTimeout: timeout})
	owners := []*Pool{open(), open()}
	const capacity = 2
	type res struct {
		owner  *Pool
		id     ResourceID
		active atomic.Int64
	}
	var rs []*res
	for i, o := range owners {
		id, err := o.Register(Key{0xa76b, uint64(10 + i)}, capacity)
		if err != nil {
			t.Fatal(err)
		}
		rs = append(rs, &res{owner: o, id: id})
	}
	reservers := []*Pool{open(), open(), open()}

	var claims atomic.Int64
	h := func() {
		if claims.Add(1)%5 == 0 {
			time.Sleep(3*timeout + time.Duration(rand.IntN(3))*timeout)
		}
	}
	testHookClaimed.Store(&h)
	defer testHookClaimed.Store(nil)

	// Accepts and Completes, with the counts the test keeps, under the
	// read lock; the monitor takes the write lock for a quiescent view.
	var mu sync.RWMutex
	accept := func(r *res, l Lease) bool {
		mu.RLock()
		defer mu.RUnlock()
		e, err := r.owner.Accept(l)
		if err != nil {
			return false
		}
		if n := r.active.Add(1); n > capacity {
			t.Errorf("%d executions on %v, capacity %d", n, r.id, capacity)
		}
		go func() {
			time.Sleep(time.Duration(rand.IntN(3)) * time.Millisecond)
			mu.RLock()
			defer mu.RUnlock()
			r.active.Add(-1)
			e.Complete()
		}()
		return true
	}

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var accepted, doubles atomic.Int64
	for _, rp := range reservers {
		for range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					r := rs[rand.IntN(len(rs))]
					l, err := rp.Reserve(r.id)
					if err != nil {
						if !errors.Is(err, ErrBusy) {
							t.Errorf("Reserve: %v", err)
							return
						}
						time.Sleep(100 * time.Microsecond)
						continue
					}
					if rand.IntN(3) == 0 {
						time.Sleep(time.Duration(rand.IntN(4)) * time.Millisecond)
					}
					switch rand.IntN(4) {
					case 0:
						rp.Withdraw(l)
					case 1:
						if accept(r, l) {
							accepted.Add(1)
						}
					case 2: // two Accepts of one lease at once
						var ok [2]bool
						var w2 sync.WaitGroup
						for i := range ok {
							w2.Add(1)
							go func() { defer w2.Done(); ok[i] = accept(r, l) }()
						}
						w2.Wait()
						if ok[0] && ok[1] {
							doubles.Add(1)
							t.Errorf("lease %+v accepted twice", l)
						}
					case 3: // an Accept racing a withdrawal
						done := make(chan struct{})
						go func() { defer close(done); rp.Withdraw(l) }()
						accept(r, l)
						<-done
						// A replay after both must be refused.
						if accept(r, l) {
							t.Errorf("lease %+v accepted after it was withdrawn or accepted", l)
						}
					}
				}
			}()
		}
	}
	// The monitor.
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(200 * time.Microsecond):
			}
			mu.Lock()
			for _, r := range rs {
				s := r.owner.seg
				w := atomic.LoadUint64(s.u64(s.slotOff(r.id.Lane(), r.id.Slot()) + slWord))
				if wGen(w) != r.id.Generation() || wState(w) != StateLive {
					t.Errorf("resource %v: slot word %#x", r.id, w)
				}
				usesHeld(t, r.id, w, r.active.Load(), capacity)
			}
			mu.Unlock()
		}
	}()
	time.Sleep(3 * time.Second)
	close(stop)
	wg.Wait()
	testHookClaimed.Store(nil)
	// Let executions complete and reservations age.
	deadline := time.Now().Add(3 * time.Second)
	for {
		time.Sleep(20 * time.Millisecond)
		busy := false
		for _, r := range rs {
			if err := r.owner.Reconcile(); err != nil {
				t.Error(err)
			}
			if n, _ := r.owner.Users(r.id); n != 0 || r.active.Load() != 0 {
				busy = true
			}
		}
		if !busy || time.Now().After(deadline) {
			break
		}
	}
	for _, r := range rs {
		if n, err := r.owner.Users(r.id); n != 0 || err != nil {
			t.Errorf("resource %v: %d users, %v, after every lease ended", r.id, n, err)
		}
		noTickets(t, r.owner, r.id)
		wholeAgain(t, reservers[0], r.id, capacity, func(l Lease) bool { return accept(r, l) })
	}
	t.Logf("%d accepted, %d claims", accepted.Load(), claims.Load())
}

// usesHeld fails t unless slot word w of id counts as many uses as the
// executions held, and no more uses and reservations than capacity.
func usesHeld(t *testing.T, id ResourceID, w uint64, held int64, capacity int) {
	t.Helper()
	if int64(wUse(w)) != held {
		t.Errorf("resource %v: %d uses in the slot, %d executions held", id, wUse(w), held)
	}
	if wUse(w)+wPendN(w) > capacity {
		t.Errorf("resource %v: %d uses + %d pending > capacity %d", id, wUse(w), wPendN(w), capacity)
	}
}

// wholeAgain fails t unless r can reserve all capacity units of id again,
// and accept takes every lease.
func wholeAgain(t *testing.T, r *Pool, id ResourceID, capacity int, accept func(Lease) bool) {
	t.Helper()
	var ls []Lease
	for range capacity {
		l, err := r.Reserve(id)
		if err != nil {
			t.Errorf("resource %v: reservation %d of %d after the churn: %v", id, len(ls)+1, capacity, err)
			break
		}
		ls = append(ls, l)
	}
	for _, l := range ls {
		if !accept(l) {
			t.Errorf("a lease after the churn was refused")
		}
	}
}
