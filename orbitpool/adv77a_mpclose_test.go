package orbitpool

import (
	"errors"
	"path/filepath"
	"testing"
	"time"
)

func init() { mpMoreRoles["adv77a-reserver"] = adv77aRoleReserver }

// adv77aRoleReserver serves the parent's commands until it leaves:
// "reserve" (IDs[0]) answers "lease" with the lease, or its error;
// "withdraw" (Lease) withdraws it and answers "withdrawn".
func adv77aRoleReserver(c *mpChildCtx) error {
	p, err := c.open()
	if err != nil {
		return err
	}
	c.send(mpMsg{Type: "ready", Lane: p.lane})
	for m := range c.cmds {
		switch m.Type {
		case "reserve":
			l, err := p.Reserve(m.IDs[0])
			if err != nil {
				c.send(mpMsg{Type: "lease", Err: err.Error()})
				continue
			}
			b, err := l.MarshalBinary()
			if err != nil {
				return err
			}
			c.send(mpMsg{Type: "lease", Lease: b})
		case "withdraw":
			var l Lease
			if err := l.UnmarshalBinary(m.Lease); err != nil {
				return err
			}
			p.Withdraw(l)
			c.send(mpMsg{Type: "withdrawn"})
		default:
			c.fail("unknown command %q", m.Type)
		}
	}
	return p.Close()
}

// TestAdv77aMPAcceptHeldAcrossOwnerClose: a sibling process reserves the
// owner's only unit and hands the lease over; the owner's Accept is held
// after its claim while another goroutine closes the owner pool, a new
// pool of this process takes the lane and registers the key, and the
// sibling reserves the new resource. The held Accept must then refuse;
// the sibling's withdrawal of its first lease must leave the new
// reservation alone; the new owner accepts the new lease; and in the end
// the resource is idle, with no ticket or claim left, and serves again.
func TestAdv77aMPAcceptHeldAcrossOwnerClose(t *testing.T) {
	spec := PoolSpec{Lanes: 2, Keys: 4, ResourcesPerLane: 2, Path: filepath.Join(t.TempDir(), "seg")}
	key := Key{0xa77a, 10}
	owner, err := Open(spec, adv77aOpts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { owner.Close() })
	id, err := owner.Register(key, 1)
	if err != nil {
		t.Fatal(err)
	}
	c := mpStart(t, "adv77a-reserver", mpArgs{Spec: spec, Reconcile: adv77aOpts.ReconcileInterval, ResTimeout: adv77aOpts.ReservationTimeout, Lifetime: 30 * time.Second})
	c.expect("ready", 10*time.Second)
	reserve := func(id ResourceID) Lease {
		t.Helper()
		c.send(mpMsg{Type: "reserve", IDs: []ResourceID{id}})
		m := c.expect("lease", 10*time.Second)
		if m.Err != "" {
			t.Fatalf("the sibling's reservation of %v: %s", id, m.Err)
		}
		var l Lease
		if err := l.UnmarshalBinary(m.Lease); err != nil {
			t.Fatal(err)
		}
		return l
	}
	l := reserve(id)
	var next *Pool
	var nid ResourceID
	var l2 Lease
	holdNextClaim(t, func() {
		closed := make(chan error, 1)
		go func() { closed <- owner.Close() }()
		select {
		case err := <-closed:
			if err != nil {
				t.Errorf("owner Close: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("the owner's Close did not return within 5s while its Accept was held")
		}
		next = adv77aOpen(t, spec, adv77aOpts)
		if next.lane != id.Lane() {
			t.Fatalf("the new pool took lane %d, want %d", next.lane, id.Lane())
		}
		var err error
		if nid, err = next.Register(key, 1); err != nil {
			t.Fatal(err)
		}
		l2 = reserve(nid)
	})
	e, err := owner.Accept(l)
	if e != nil || err == nil {
		t.Fatalf("the held Accept of the closed owner returned %v, %v; want an error", e, err)
	}
	if !errors.Is(err, ErrStale) && !errors.Is(err, ErrClosed) {
		t.Errorf("the held Accept: %v, want ErrStale or ErrClosed", err)
	}
	if got := adv77aTicket(next, nid, int(l2.Bit)); got != l2.Ticket {
		t.Errorf("the new reservation's ticket is %#x, want %#x", got, l2.Ticket)
	}
	b, _ := l.MarshalBinary()
	c.send(mpMsg{Type: "withdraw", Lease: b})
	c.expect("withdrawn", 10*time.Second)
	if n, err := next.Users(nid); n != 1 || err != nil {
		t.Errorf("after the sibling withdrew its dead lease: %d users (%v), want 1", n, err)
	}
	e2, err := next.Accept(l2)
	if err != nil {
		t.Fatalf("Accept of the sibling's new lease: %v", err)
	}
	e2.Complete()
	if n, err := next.Users(nid); n != 0 || err != nil {
		t.Errorf("%d users (%v) after the last use, want 0", n, err)
	}
	noTickets(t, next, nid)
	// And once more, through the sibling: the unit is whole.
	l3 := reserve(nid)
	e3, err := next.Accept(l3)
	if err != nil {
		t.Fatalf("Accept of a third lease: %v", err)
	}
	e3.Complete()
	noTickets(t, next, nid)
	c.finish(10 * time.Second)
}
