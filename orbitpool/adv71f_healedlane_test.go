package orbitpool

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// TestAdv71fStrayClearKeepsHealableWaiter: a live process's lane record is
// overwritten (hostile bytes: it reads free), which the process repairs
// itself on its next Reconcile (healOwnLane: the kernel's lane lock, not the
// record, says whose the lane is). Meanwhile the table fills and another
// process collects keys. clearStrayWaiters judges the live waiter's mask bit
// by the overwritten record alone, clears it as a stray, and the waiter's key
// entry is collected and recycled under it. After the record is healed, the
// key's first resource is registered: the waiter, which is still parked and
// registered in its own process, must be served. Before the fix the bit
// pinned the entry and the waiter was woken by the registration.
func TestAdv71fStrayClearKeepsHealableWaiter(t *testing.T) {
	for _, wl := range []int{5, 70} {
		t.Run(fmt.Sprintf("lane%d", wl), func(t *testing.T) {
			spec := PoolSpec{Path: filepath.Join(t.TempDir(), "seg"), Lanes: 130, Keys: 2, ResourcesPerLane: 2}
			opts := Options{ReconcileInterval: time.Hour, ReservationTimeout: time.Hour, OnError: func(error) {}}
			open := opener(t, spec, opts)
			var ps []*Pool
			for range wl + 1 {
				ps = append(ps, open())
			}
			owner, w := ps[1], ps[wl]
			k := Key{0xad71f, 50}
			res := make(chan error, 1)
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				pl, err := w.Acquire(ctx, k, adv71fWaitEmpty{}, Limits{})
				if err == nil && pl.Kind == PlanReuseRemote {
					w.Withdraw(pl.Lease)
				} else if err == nil {
					err = fmt.Errorf("acquired %v", pl.Kind)
				}
				res <- err
			}()
			s := owner.seg
			var ref keyRef
			for end := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
				var ok bool
				if ref, ok = owner.lookupKey(k); ok && qWaiting(atomic.LoadUint64(s.u64(s.queueOff(wl, ref.idx)))) == 1 {
					break
				}
				if time.Now().After(end) {
					t.Fatal("the waiter never parked")
				}
			}
			ctl := s.u64(s.laneOff(wl) + lnCtl)
			orig := atomic.LoadUint64(ctl)
			atomic.StoreUint64(ctl, laneCtl(lnGen(orig), laneFree)) // the hostile byte
			id2, err := owner.Register(Key{0xad71f, 51}, 1)
			if err == nil {
				err = owner.Unregister(id2)
			}
			if err != nil {
				atomic.StoreUint64(ctl, orig)
				t.Fatal(err)
			}
			_, err = owner.Register(Key{0xad71f, 52}, 1)
			if !errors.Is(err, ErrFull) && err != nil {
				atomic.StoreUint64(ctl, orig)
				t.Fatal(err)
			}
			bit := atomic.LoadUint64(s.u64(s.maskOff(ref.idx, wl))) & laneBit(wl)
			kc := atomic.LoadUint64(s.u64(s.keyOff(ref.idx) + kfCtl))
			// The process heals its record.
			if err := w.Reconcile(); !errors.Is(err, ErrCorrupt) {
				t.Errorf("w's Reconcile did not report (and heal) its overwritten lane record: %v", err)
			}
			if got := atomic.LoadUint64(ctl); got != orig {
				atomic.StoreUint64(ctl, orig)
				t.Fatalf("lane record not healed: %#x, want %#x", got, orig)
			}
			if _, err := owner.Register(k, 1); err != nil && !errors.Is(err, ErrFull) {
				t.Fatal(err)
			}
			if err := <-res; err != nil {
				t.Fatalf("the live waiter whose lane record was overwritten for a while lost its registration for good (its mask bit cleared as a stray): %v; after the collection: waiter bit %#x, its entry state %d gen %d (was gen %d)", err, bit, kState(kc), kGen(kc), ref.gen)
			}
		})
	}
}
