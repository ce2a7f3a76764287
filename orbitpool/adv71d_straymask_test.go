package orbitpool

import (
	"fmt"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// TestAdv71dStrayWaiterBitPinsKey: a key's waiter mask is read from the
// segment, and every walk of it skips a bit past the segment's lanes (or of a
// lane no process holds) as one no waiter stands behind. Such a bit, in a
// key with no resources, claims or waiters, must not pin the key's entry for
// ever: when the table is full, the idle key is collected and a new key gets
// an entry. The bit is in the third mask word of a 130-lane segment: past
// the last lane, and of a free lane inside it.
func TestAdv71dStrayWaiterBitPinsKey(t *testing.T) {
	for _, stray := range []int{131, 191, 129} {
		t.Run(fmt.Sprintf("lane%d", stray), func(t *testing.T) {
			spec := PoolSpec{Path: filepath.Join(t.TempDir(), "seg"), Lanes: 130, Keys: 1, ResourcesPerLane: 2}
			p, err := Open(spec, Options{ReconcileInterval: time.Hour, ReservationTimeout: time.Hour})
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			k1, k2 := Key{0xad71d, 3}, Key{0xad71d, 4}
			id, err := p.Register(k1, 1)
			if err != nil {
				t.Fatal(err)
			}
			if err := p.Unregister(id); err != nil {
				t.Fatal(err)
			}
			ref, ok := p.lookupKey(k1)
			if !ok {
				t.Fatal("k1 not found")
			}
			s := p.seg
			// The hostile byte: a waiter bit of a lane no process holds.
			atomic.OrUint64(s.u64(s.keyOff(ref.idx)+kfMasks+8*(stray>>6)), laneBit(stray))
			if _, err := p.Register(k2, 1); err != nil {
				t.Fatalf("naming a second key in a table whose only key is idle but for a waiter bit of lane %d (of %d): %v", stray, spec.Lanes, err)
			}
		})
	}
}
