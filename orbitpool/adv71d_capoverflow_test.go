package orbitpool

import (
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// TestAdv71dCorruptCapacityOverflowsUses: a slot's capacity word is read
// from the segment and may be corrupt. A resource admits at most MaxCapacity
// users, which is all the slot word's users field holds; a capacity word
// beyond it must not let local uses carry out of the users field into the
// slot's state, which turns the live resource into a slot in no state at
// all: gone from every list, its executions' Completes no-ops, Unregister
// refused as stale, and its key's budget unit held until the lane goes.
func TestAdv71dCorruptCapacityOverflowsUses(t *testing.T) {
	spec := PoolSpec{Path: filepath.Join(t.TempDir(), "seg"), Lanes: 130, Keys: 4, ResourcesPerLane: 2}
	p, err := Open(spec, Options{ReconcileInterval: time.Hour, ReservationTimeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	k := Key{0xad71d, 8}
	id, err := p.Register(k, MaxCapacity)
	if err != nil {
		t.Fatal(err)
	}
	ref, _ := p.lookupKey(k)
	s := p.seg
	off := s.slotOff(p.Lane(), id.Slot())
	// The hostile byte.
	atomic.StoreUint32(s.u32(off+slCapacity), ^uint32(0))
	var es []*Execution
	defer func() {
		for _, e := range es {
			e.Complete()
		}
	}()
	for i := 0; i <= MaxCapacity; i++ {
		e, err := p.useLocal(id, ref)
		if err != nil {
			break
		}
		es = append(es, e)
		if w := atomic.LoadUint64(s.u64(off + slWord)); wState(w) != StateLive {
			t.Fatalf("after %d uses of a resource whose capacity word reads %#x, its slot word is %#x: state %v, users %d", len(es), ^uint32(0), w, wState(w), wUse(w))
		}
	}
	if len(es) > MaxCapacity {
		t.Fatalf("%d uses of one resource, more than MaxCapacity %d", len(es), MaxCapacity)
	}
}
