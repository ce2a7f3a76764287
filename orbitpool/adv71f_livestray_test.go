package orbitpool

import (
	"context"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// adv71fWaitEmpty waits while the key has no candidate with room, and
// otherwise is LocalFirst: a waiter on a key with no resources and no
// creation under way, the one kind of key collectKeys weighs waiter bits on.
type adv71fWaitEmpty struct{}

func (adv71fWaitEmpty) Decide(v *View) Decision {
	for _, c := range v.Candidates {
		if c.Room() > 0 {
			return LocalFirst{}.Decide(v)
		}
	}
	return Decision{Action: ActionWait, Reason: ReasonBusy}
}

// TestAdv71fCollectKeepsLiveWaiterBit: a live process's waiter (its lane in
// the second or third mask word) parks on a key that has no resources and no
// creation under way. A full key table makes another process collect idle
// entries (collectKeys, which now clears waiter bits of lanes it judges
// nobody's): the waiter's entry must stay live in the same generation with
// its bit, and when the key's first resource is registered the waiter must be
// served.
func TestAdv71fCollectKeepsLiveWaiterBit(t *testing.T) {
	for _, wl := range []int{64, 129} {
		t.Run(fmt.Sprintf("lane%d", wl), func(t *testing.T) {
			spec := PoolSpec{Path: filepath.Join(t.TempDir(), "seg"), Lanes: 130, Keys: 2, ResourcesPerLane: 2}
			opts := Options{ReconcileInterval: time.Hour, ReservationTimeout: time.Hour}
			var errs atomic.Int64
			opts.OnError = func(error) { errs.Add(1) }
			open := opener(t, spec, opts)
			var ps []*Pool
			for range wl + 1 {
				ps = append(ps, open())
			}
			owner, w := ps[1], ps[wl]
			k := Key{0xad71f, 10}
			res := make(chan error, 1)
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				pl, err := w.Acquire(ctx, k, adv71fWaitEmpty{}, Limits{})
				if err == nil && pl.Kind == PlanReuseRemote {
					owner.Withdraw(pl.Lease)
				} else if err == nil {
					err = fmt.Errorf("acquired %v", pl.Kind)
				}
				res <- err
			}()
			var ref keyRef
			s := owner.seg
			for end := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
				var ok bool
				if ref, ok = owner.lookupKey(k); ok && qWaiting(atomic.LoadUint64(s.u64(s.queueOff(wl, ref.idx)))) == 1 {
					break
				}
				if time.Now().After(end) {
					t.Fatal("the waiter never parked")
				}
			}
			// Fill the table: k2 idle, then k3 forces a collection
			// that weighs k's waiter bit.
			id2, err := owner.Register(Key{0xad71f, 11}, 1)
			if err != nil {
				t.Fatal(err)
			}
			if err := owner.Unregister(id2); err != nil {
				t.Fatal(err)
			}
			if _, err := owner.Register(Key{0xad71f, 12}, 1); err != nil {
				t.Fatalf("third key (k2 idle, collectable): %v", err)
			}
			c := atomic.LoadUint64(s.u64(s.keyOff(ref.idx) + kfCtl))
			if kState(c) != keyLive || kGen(c) != ref.gen {
				t.Fatalf("the live waiter's key entry was collected (state %d gen %d, was %d)", kState(c), kGen(c), ref.gen)
			}
			if atomic.LoadUint64(s.u64(s.maskOff(ref.idx, wl)))&laneBit(wl) == 0 {
				t.Fatalf("the live waiter's bit (lane %d) was cleared", wl)
			}
			if n := errs.Load(); n != 0 {
				t.Errorf("%d errors reported for a sound segment", n)
			}
			if _, err := owner.Register(k, 1); err != nil {
				t.Fatal(err)
			}
			if err := <-res; err != nil {
				t.Fatalf("the live waiter was not served once its key had a resource: %v", err)
			}
		})
	}
}
