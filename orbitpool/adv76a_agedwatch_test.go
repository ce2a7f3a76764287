package orbitpool

import (
	"path/filepath"
	"testing"
	"time"
)

func init() { mpMoreRoles["adv76a-reserver"] = adv76aRoleReserver }

// adv76aRoleReserver reserves c.args.IDs[0] and waits to be killed.
func adv76aRoleReserver(c *mpChildCtx) error {
	p, err := c.open()
	if err != nil {
		return err
	}
	if _, err := p.Reserve(c.args.IDs[0]); err != nil {
		return err
	}
	c.send(mpMsg{Type: "reserved"})
	c.untilParentLeaves()
	return nil
}

// TestAdv76aAgedReservationWakesOwnersWatch: the counterpart of
// TestWithdrawWakesOwnersWatch for a reservation that is never withdrawn: a
// watches key K (its requests wait for room) and a sibling reserves a's one
// resource of K, then never delivers nor withdraws the lease ("silent": it
// stays alive; "killed": it is SIGKILLed). a's Reconcile ages the
// reservation out and the unit comes back on a's resource, in a's own
// dispatcher. As with a withdrawn unit, nothing else tells a's watch that
// its key got room (roomCame's own comment: "One that a sibling gives back
// there (a reservation withdrawn or aged out) is told to lane l too"); it
// must be woken.
func TestAdv76aAgedReservationWakesOwnersWatch(t *testing.T) {
	for _, mode := range []string{"silent", "killed"} {
		t.Run(mode, func(t *testing.T) {
			spec := PoolSpec{Lanes: 4, Keys: 4, ResourcesPerLane: 2, Path: filepath.Join(t.TempDir(), "seg")}
			open := opener(t, spec, Options{ReconcileInterval: 10 * time.Millisecond, ReservationTimeout: 30 * time.Millisecond})
			a := open()
			k := Key{0xa76f, 1}
			id, err := a.Register(k, 1)
			if err != nil {
				t.Fatal(err)
			}
			wa, err := a.WatchRoom(k)
			if err != nil {
				t.Fatal(err)
			}
			defer wa.Close()
			if mode == "silent" {
				if _, err := open().Reserve(id); err != nil {
					t.Fatal(err)
				}
			} else {
				c := mpStart(t, "adv76a-reserver", mpArgs{Spec: spec, IDs: []ResourceID{id}, Reconcile: time.Hour, ResTimeout: time.Second, Lifetime: 30 * time.Second})
				c.expect("reserved", 10*time.Second)
				c.kill()
			}
			deadline := time.Now().Add(3 * time.Second)
			for {
				if n, _ := a.Users(id); n == 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("setup: the reservation was never aged out")
				}
				time.Sleep(5 * time.Millisecond)
			}
			if !readyWithin(wa.Ready(), 2*time.Second) {
				t.Fatal("the unit of a's resource that a's Reconcile aged out came back, and a's watch of the key was not woken within 2s")
			}
		})
	}
}
