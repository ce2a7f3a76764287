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

// adv2HeldDefers is TestDeliveredGrantIsNotTaken between lanes x and y of
// ps: x's Readiness is handed the unit, y's younger Acquire must wait, and
// gets it once the Readiness closes. Each lane's held word is checked along
// the way.
func adv2HeldDefers(t *testing.T, x, y *Pool, k Key) {
	t.Helper()
	lim := Limits{MaxResources: 1}
	r := handedTheUnit(t, x, x, k, lim)
	ref, _ := x.lookupKey(k)
	if h, ok := x.seg.heldOf(x.Lane(), ref.idx); !ok || h != uint32(r.w.ticket) {
		t.Fatalf("lane %d's held word: %d %v, want ticket %d", x.Lane(), h, ok, uint32(r.w.ticket))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if plan, err := y.Acquire(ctx, k, LocalOnly{}, lim); err == nil {
		plan.Permit.Close()
		r.Close()
		t.Fatalf("lane %d's younger waiter took the unit handed to lane %d's (ticket %d)", y.Lane(), x.Lane(), r.w.ticket)
	} else if we := (*WaitError)(nil); !errors.As(err, &we) {
		t.Fatalf("younger waiter: %v, want a WaitError", err)
	}
	r.Close()
	if _, ok := x.seg.heldOf(x.Lane(), ref.idx); ok {
		t.Fatalf("lane %d's held word still set after its Readiness closed", x.Lane())
	}
	ctx, cancel = context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	plan, err := y.Acquire(ctx, k, LocalOnly{}, lim)
	if err != nil || plan.Kind != PlanCreate {
		t.Fatalf("acquire after the watcher left: %v %v", plan.Kind, err)
	}
	plan.Permit.Close()
}

// TestAdv2HeldTicketWrap: tickets are compared in their low 32 bits, and a
// held word keeps only those (and a valid bit, so that a low half of 0 is a
// ticket). Around the wrap of the low half and across its sign bit, the
// younger waiter still defers.
func TestAdv2HeldTicketWrap(t *testing.T) {
	for _, last := range []uint64{1<<32 - 1, 1<<32 - 2, 1<<31 - 1, 3<<32 - 1} {
		t.Run(fmt.Sprintf("%#x", last), func(t *testing.T) {
			ps := openShared(t, small, 2)
			k := Key{0xad2e, 0x3a}
			ref, err := ps[0].internKey(k)
			if err != nil {
				t.Fatal(err)
			}
			atomic.StoreUint64(ps[0].seg.u64(ps[0].seg.keyOff(ref.idx)+kfTicket), last)
			adv2HeldDefers(t, ps[0], ps[1], k)
			adv2HeldDefers(t, ps[1], ps[0], k)
		})
	}
}

// TestAdv2HeldManyLanes: with more than 64 lanes a key's waiter mask is
// several words; a held word in a lane of the second word defers a waiter of
// the first, and the other way round.
func TestAdv2HeldManyLanes(t *testing.T) {
	spec := PoolSpec{Path: filepath.Join(t.TempDir(), "seg"), Lanes: 256, Keys: 4, ResourcesPerLane: 2}
	var ps []*Pool
	for range 70 {
		p, err := Open(spec, Options{ReconcileInterval: time.Hour, ReservationTimeout: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		ps = append(ps, p)
	}
	hi := ps[len(ps)-1]
	if hi.Lane() < 64 {
		t.Fatalf("last lane %d", hi.Lane())
	}
	adv2HeldDefers(t, hi, ps[0], Key{0xad2e, 0x3b})
	adv2HeldDefers(t, ps[0], hi, Key{0xad2e, 0x3c})
	adv2HeldDefers(t, ps[65], hi, Key{0xad2e, 0x3d})
}

// TestAdv2HeldWordClearedEveryWay: every way a delivered grant ends clears
// the lane's held word: taken by Acquire, its context ending while granted,
// Readiness.Close, and closeAll. And a key entry collected and given to
// another key starts with no held word in any lane, so the new key's
// waiters defer to nothing of the old one's.
func TestAdv2HeldWordClearedEveryWay(t *testing.T) {
	spec := PoolSpec{Path: filepath.Join(t.TempDir(), "seg"), Lanes: 4, Keys: 2, ResourcesPerLane: 4}
	open := opener(t, spec, Options{ReconcileInterval: time.Hour, ReservationTimeout: time.Hour})
	a, b := open(), open()
	lim := Limits{MaxResources: 1}
	anyHeld := func(p *Pool, idx int) string {
		for l := range p.l.nlanes {
			if h, ok := p.seg.heldOf(l, idx); ok {
				return fmt.Sprintf("lane %d names held ticket %d", l, h)
			}
		}
		return ""
	}
	k := Key{0xad2e, 0x50}
	ref, _ := a.internKey(k)

	// Granted while its context ends: the waiter leaves with the grant.
	for range 50 {
		plan, err := b.Acquire(context.Background(), k, LocalOnly{}, lim)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			plan, err := a.Acquire(ctx, k, LocalOnly{}, lim)
			if err == nil {
				plan.Permit.Close()
			}
			done <- err
		}()
		waitFor(t, func() bool { return registeredWaiters(a, k) == 1 })
		go cancel()
		plan.Permit.Close()
		<-done
		waitFor(t, func() bool { return registeredWaiters(a, k) == 0 })
		if s := anyHeld(a, ref.idx); s != "" {
			t.Fatalf("after a granted waiter was cancelled: %s", s)
		}
	}
	// closeAll with a held Readiness.
	c := open()
	plan, err := a.Acquire(context.Background(), k, LocalOnly{}, lim)
	if err != nil {
		t.Fatal(err)
	}
	r, err := c.Watch(k)
	if err != nil {
		t.Fatal(err)
	}
	plan.Permit.Close()
	<-r.Ready()
	if s := anyHeld(a, ref.idx); s == "" {
		t.Fatal("no held word while c's Readiness holds a grant")
	}
	c.Close()
	if s := anyHeld(a, ref.idx); s != "" {
		t.Fatalf("after the holder's pool closed: %s", s)
	}
	// Collected and recycled: fill the table with other keys.
	k2, k3 := Key{0xad2e, 0x51}, Key{0xad2e, 0x52}
	if _, err := a.internKey(k2); err != nil {
		t.Fatal(err)
	}
	ref3, err := a.internKey(k3) // collects k's entry
	if err != nil {
		t.Fatal(err)
	}
	if ref3.idx != ref.idx {
		t.Fatalf("k3 got entry %d, not k's %d", ref3.idx, ref.idx)
	}
	if s := anyHeld(a, ref3.idx); s != "" {
		t.Fatalf("recycled entry: %s", s)
	}
	adv2HeldDefers(t, a, b, k3)
}

// heldOf reads lane l's held word for key k: the ticket of its oldest waiter
// holding a delivered grant, if any.
func (s *segment) heldOf(l, k int) (ticket uint32, ok bool) {
	_, _, _, h := s.laneOrder(l, k)
	return uint32(h), h&qHeldValid != 0
}
