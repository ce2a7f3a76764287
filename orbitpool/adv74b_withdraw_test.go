package orbitpool

import (
	"testing"
	"time"
)

// TestAdv74bWithdrawWakesOwnWatch: b watches key K, whose one resource is
// a's. b reserves a's unit (a lease it then cannot deliver) and withdraws
// it: the unit comes back on a's resource, a sibling's, after b's watch was
// armed. Every watch of K armed before must be woken, b's included: the room
// is on a sibling's resource, which only the watch tells b's other callers
// of (roomCame leaves out the lane of the process giving the unit back, not
// the lane of the resource's owner).
func TestAdv74bWithdrawWakesOwnWatch(t *testing.T) {
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
	wc, err := c.WatchRoom(k)
	if err != nil {
		t.Fatal(err)
	}
	defer wc.Close()
	l, err := b.Reserve(id)
	if err != nil {
		t.Fatal(err)
	}
	b.Withdraw(l)
	if !readyWithin(wc.Ready(), 3*time.Second) {
		t.Fatal("control: c's watch not woken by the unit b withdrew on a's resource")
	}
	if !readyWithin(wb.Ready(), time.Second) {
		t.Fatal("b's own watch not woken by the unit b withdrew on a's (a sibling's) resource; c's was")
	}
}

// TestAdv74bWithdrawWakesSoleWatch: as above with b the only watcher: the
// unit b withdraws on a's resource must still wake b's watch (and count).
func TestAdv74bWithdrawWakesSoleWatch(t *testing.T) {
	spec := PoolSpec{Lanes: 4, Keys: 4, ResourcesPerLane: 2}
	ps := openShared(t, spec, 2)
	a, b := ps[0], ps[1]
	k := Key{0x74b, 12}
	id, err := a.Register(k, 1)
	if err != nil {
		t.Fatal(err)
	}
	wb, err := b.WatchRoom(k)
	if err != nil {
		t.Fatal(err)
	}
	defer wb.Close()
	l, err := b.Reserve(id)
	if err != nil {
		t.Fatal(err)
	}
	b.Withdraw(l)
	if !readyWithin(wb.Ready(), 2*time.Second) {
		t.Fatal("b's watch (the only one) not woken within 2s by the unit b withdrew on a's (a sibling's) resource")
	}
}
