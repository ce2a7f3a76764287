package orbitpool

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// adv77aWithin runs f and fails t if it takes longer than adv77aBound.
func adv77aWithin(t *testing.T, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	start := time.Now()
	go func() { defer close(done); f() }()
	select {
	case <-done:
	case <-time.After(adv77aBound):
		t.Fatalf("%s still running after %v", what, adv77aBound)
	}
	if d := time.Since(start); d > adv77aBound {
		t.Errorf("%s took %v", what, d)
	}
}

// TestAdv77aHostileKeySummary: with 4 and with 70 lanes, a key's waiter,
// room and watch masks are set to all ones (every lane that does not exist
// included), its room sequence and every lane's queue words for it to
// random values, and its owner's list for it into a cycle, while a sibling
// watches it for room and two lanes wait on it. Neediest names only a live
// sibling that waits, with counts within the lane's slots; Acquire,
// UnregisterToward and CloseToward with lanes out of range, Readiness and
// RoomWatch Close all return within adv77aBound; a withdrawn reservation
// still rings the watching sibling; and a key nobody corrupted serves from
// the owner to the sibling after.
func TestAdv77aHostileKeySummary(t *testing.T) {
	for _, lanes := range []int{4, 70} {
		t.Run(fmt.Sprintf("lanes=%d", lanes), func(t *testing.T) {
			adv77aHostileKeySummary(t, lanes)
		})
	}
}

func adv77aHostileKeySummary(t *testing.T, lanes int) {
	spec := PoolSpec{Lanes: lanes, Keys: 4, ResourcesPerLane: 4, Path: filepath.Join(t.TempDir(), "seg")}
	opts := Options{ReconcileInterval: 5 * time.Millisecond, ReservationTimeout: time.Minute}
	a := adv77aOpen(t, spec, opts)
	b := adv77aOpen(t, spec, opts)
	c := adv77aOpen(t, spec, opts)
	k, g := Key{0xa77a, 30}, Key{0xa77a, 31}
	id0, err := a.Register(k, 1)
	if err != nil {
		t.Fatal(err)
	}
	id1, err := a.Register(k, 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Register(k, 1); err != nil {
		t.Fatal(err)
	}
	gid, err := a.Register(g, 1)
	if err != nil {
		t.Fatal(err)
	}
	w, err := b.WatchRoom(k)
	if err != nil {
		t.Fatal(err)
	}
	rd, err := b.Watch(k)
	if err != nil {
		t.Fatal(err)
	}
	rdc, err := c.Watch(k)
	if err != nil {
		t.Fatal(err)
	}
	ref, ok := a.lookupKey(k)
	if !ok {
		t.Fatal("key not found")
	}
	s := a.seg
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 30))
	for i := range s.l.maskWords {
		atomic.StoreUint64(s.u64(s.maskOff(ref.idx, 64*i)), ^uint64(0))
		atomic.StoreUint64(s.u64(s.roomOff(ref.idx, 64*i)), ^uint64(0))
		atomic.StoreUint64(s.u64(s.watchOff(ref.idx, 64*i)), ^uint64(0))
	}
	atomic.StoreUint64(s.u64(s.keyOff(ref.idx)+kfRoomSeq), rng.Uint64())
	for l := range lanes {
		for j := range 3 {
			atomic.StoreUint64(s.u64(s.queueOff(l, ref.idx)+8*j), rng.Uint64()&^qGrantMask)
		}
	}
	o0, o1 := s.slotOff(a.lane, id0.Slot()), s.slotOff(a.lane, id1.Slot())
	atomic.StoreUint32(s.u32(s.headOff(a.lane, ref.idx)), uint32(id0.Slot())+1)
	atomic.StoreUint32(s.u32(o0+slNext), uint32(id1.Slot())+1)
	atomic.StoreUint32(s.u32(o1+slNext), uint32(id0.Slot())+1)

	adv77aWithin(t, "Neediest", func() {
		lane, held, own, ok := a.Neediest(k)
		if ok && lane != b.lane && lane != c.lane {
			t.Errorf("Neediest named lane %d, not a live sibling that waits (%d, %d)", lane, b.lane, c.lane)
		}
		if held < 0 || held > spec.ResourcesPerLane || own < 0 || own > spec.ResourcesPerLane {
			t.Errorf("Neediest counted %d held and %d own, past %d slots a lane", held, own, spec.ResourcesPerLane)
		}
	})
	adv77aWithin(t, "NeediestBy", func() {
		lane, _, _, ok := a.NeediestBy(k, func(l, h int) int { return -l })
		if ok && lane != b.lane && lane != c.lane {
			t.Errorf("NeediestBy named lane %d", lane)
		}
	})
	adv77aWithin(t, "Acquire", func() {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		plan, err := b.Acquire(ctx, k, LocalFirst{}, Limits{MaxResources: 3})
		if err != nil && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrBusy) && !errors.Is(err, ErrBudget) {
			t.Errorf("Acquire: %v", err)
		}
		if plan.Lease.Ticket != 0 {
			b.Withdraw(plan.Lease)
		}
		if plan.Permit != nil {
			plan.Permit.Close()
		}
		if plan.Execution != nil {
			plan.Execution.Complete()
		}
	})
	// The watch: Rearm it (it may have fired on the corrupted sequence),
	// then a withdrawn reservation on the owner's resource rings it.
	adv77aWithin(t, "the watch", func() {
		select {
		case <-w.Ready():
			w.Rearm()
		default:
		}
		var l Lease
		for _, id := range []ResourceID{id0, id1} {
			if l, err = c.Reserve(id); err == nil {
				break
			}
		}
		if l.Ticket == 0 {
			t.Errorf("no reservation on the owner's resources: %v", err)
			return
		}
		c.Withdraw(l)
		select {
		case <-w.Ready():
		case <-time.After(adv77aBound / 2):
			t.Errorf("a unit given back by a withdrawal did not ring the watching sibling")
		}
	})
	adv77aWithin(t, "UnregisterToward a lane out of range", func() {
		if err := a.UnregisterToward(id1, 1000); err != nil && !errors.Is(err, ErrCorrupt) {
			t.Errorf("UnregisterToward: %v", err)
		}
		if err := a.UnregisterToward(id0, -7); err != nil && !errors.Is(err, ErrCorrupt) {
			t.Errorf("UnregisterToward: %v", err)
		}
	})
	adv77aWithin(t, "CloseToward a lane out of range", func() {
		for _, lane := range []int{5000, -2, lanes} {
			cp, err := a.ClaimCreate(k, Limits{})
			if err != nil {
				t.Errorf("ClaimCreate: %v", err)
				return
			}
			if err := cp.CloseToward(lane); err != nil {
				t.Errorf("CloseToward(%d): %v", lane, err)
			}
		}
	})
	adv77aWithin(t, "closing the watches", func() {
		rd.Close()
		rdc.Close()
		w.Close()
	})
	adv77aWithin(t, "the untouched key", func() {
		ctx, cancel := context.WithTimeout(context.Background(), adv77aBound/2)
		defer cancel()
		plan, err := b.Acquire(ctx, g, LocalFirst{}, Limits{})
		if err != nil || plan.Lease.ID != gid {
			t.Errorf("Acquire of the untouched key: %+v, %v", plan, err)
			return
		}
		e, err := a.Accept(plan.Lease)
		if err != nil {
			t.Errorf("Accept on the untouched key: %v", err)
			return
		}
		e.Complete()
	})
	for _, p := range []*Pool{a, b, c} {
		adv77aWithin(t, "Close", func() {
			if err := p.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
		})
	}
}
