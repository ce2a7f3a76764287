package orbitpool

import (
	"testing"
	"time"
)

// TestAdv74bWithdrawWakesWatch: b watches key K, whose one resource is a's.
// b reserves a's unit (a lease it then cannot deliver) and withdraws it: the
// unit comes back on a's resource, a sibling's, after b's watch was armed.
// Every watch of K armed before must be woken, b's included, whether or not
// another process watches too: the room is on a sibling's resource, which
// only the watch tells b's other callers of. (roomCame once left out the
// lane of the process giving the unit back rather than the lane of the
// resource's owner: b's watch went uncounted when it was the only one.)
func TestAdv74bWithdrawWakesWatch(t *testing.T) {
	for _, other := range []bool{false, true} {
		spec := PoolSpec{Lanes: 4, Keys: 4, ResourcesPerLane: 2}
		ps := openShared(t, spec, 3)
		a, b, c := ps[0], ps[1], ps[2]
		k := Key{0x74b, 11}
		id, err := a.Register(k, 1)
		if err != nil {
			t.Fatal(err)
		}
		wb, err := b.WatchRoom(k)
		if err != nil {
			t.Fatal(err)
		}
		defer wb.Close()
		var wc *RoomWatch
		if other {
			if wc, err = c.WatchRoom(k); err != nil {
				t.Fatal(err)
			}
			defer wc.Close()
		}
		l, err := b.Reserve(id)
		if err != nil {
			t.Fatal(err)
		}
		b.Withdraw(l)
		if !readyWithin(wb.Ready(), 2*time.Second) {
			t.Fatalf("another watcher %v: b's watch not woken within 2s by the unit b withdrew on a's (a sibling's) resource", other)
		}
		if other && !readyWithin(wc.Ready(), 2*time.Second) {
			t.Fatal("c's watch not woken by the unit b withdrew on a's resource")
		}
	}
}
