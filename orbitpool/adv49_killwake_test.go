package orbitpool

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"
)

// adv49: a process killed after Unregister gave its unit of budget back to
// the key (keyRelease) and before it woke the key's waiters (grant) leaves
// them asleep. Reclaiming its lane recounts the key from the slots, finds the
// counters already right, and so wakes nobody; the dead lane had no waiter on
// the key, so its regrants do not cover it either. The waiter sleeps until
// its deadline with the budget free, and every waiter that queues behind it
// does the same while the queue lasts.

var adv49KeyWake = Key{Hi: 0xad49, Lo: 2}

func init() { mpMoreRoles["adv49-unregister-killed"] = adv49RoleUnregisterKilled }

// adv49RoleUnregisterKilled owns the key's one resource, in use, and on
// command runs Unregister's steps (pool.go, unregister) up to and including
// the budget's return, where the parent kills it: the instant between
// keyRelease and grant.
func adv49RoleUnregisterKilled(c *mpChildCtx) error {
	p, err := c.open()
	if err != nil {
		return err
	}
	cp, err := p.ClaimCreate(c.args.Key, Limits{MaxResources: 1})
	if err != nil {
		return err
	}
	e, err := cp.RegisterAndAccept(1)
	if err != nil {
		return err
	}
	id := e.ID()
	c.send(mpMsg{Type: "ready", Lane: p.Lane(), IDs: []ResourceID{id}})
	if _, err := c.expect("unregister"); err != nil {
		return err
	}
	_, _, k, kg, err := unregisterToRelease(p, id)
	if err != nil {
		return err
	}
	p.keyRelease(k, kg, false)
	// SIGKILL lands here, before `if p.queued(k) { p.grant(k, 1, prefer) }`
	// and `p.returned(off, freed, k)`.
	c.send(mpMsg{Type: "released"})
	time.Sleep(time.Minute)
	return fmt.Errorf("not killed")
}

// unregisterToRelease runs Unregister's steps (slots.go, unregister),
// verbatim, up to but not including the budget's return (keyRelease), for
// roles that are killed or interleaved from there: it returns the slot's
// offset, its freed word (without the returning mark) and its key entry.
// The structure lock is left held shared, as Unregister holds it.
func unregisterToRelease(p *Pool, id ResourceID) (off int, freed uint64, k int, kg uint32, err error) {
	if off, err = p.ownSlot(id); err != nil {
		return
	}
	s := p.seg
	if err = p.rlockOpen(); err != nil {
		return
	}
	p.laneMu.Lock()
	for {
		w := atomic.LoadUint64(s.u64(off + slWord))
		if wGen(w) != id.Generation() || wState(w) != StateLive {
			p.laneMu.Unlock()
			return off, 0, 0, 0, fmt.Errorf("unregister %v: %w", id, ErrStale)
		}
		freed = slotWord(nextGen(wGen(w)), StateFree, 0, 0)
		if atomic.CompareAndSwapUint64(s.u64(off+slWord), w, freed|slReturning) {
			break
		}
	}
	for b := range PendingReservations {
		atomic.StoreUint64(s.u64(off+slTickets+8*b), 0)
	}
	k, kg, ok := p.slotKey(off)
	if ok {
		p.unlink(k, id.Slot())
	}
	p.free = append(p.free, int32(id.Slot()))
	p.laneMu.Unlock()
	if !ok {
		return off, freed, k, kg, fmt.Errorf("unregister %v: key entry %d of %d", id, k, p.l.nkeys)
	}
	return off, freed, k, kg, nil
}

func TestAdv49KilledUnregisterLeavesWaitersAsleep(t *testing.T) {
	p, spec := mpOpenParent(t, Options{ReconcileInterval: time.Hour})
	lim := Limits{MaxResources: 1}
	c := mpStart(t, "adv49-unregister-killed", mpArgs{Spec: spec, Key: adv49KeyWake, Reconcile: time.Hour, ResTimeout: time.Second, Lifetime: 30 * time.Second})
	c.expect("ready", 5*time.Second)

	// The key's budget is used up by the child's busy resource: the parent
	// waits.
	res := mpAcquireAsync(p, 3*time.Second, adv49KeyWake, lim)
	if _, ok := mpWaitSnap(p, 2*time.Second, func(s Snapshot) bool { return mpKS(s, adv49KeyWake).Waiting == 1 }); !ok {
		t.Fatalf("the parent's Acquire never parked on the key")
	}
	select {
	case r := <-res:
		t.Fatalf("Acquire returned before any capacity came back: %v %v", r.plan.Kind, r.err)
	default:
	}

	c.send(mpMsg{Type: "unregister"})
	c.expect("released", 5*time.Second)
	c.kill()
	start := time.Now()
	if err := p.Reconcile(); err != nil {
		t.Fatalf("Reconcile: %v", err)
	}
	snap, _ := p.Snapshot()
	// The waiter, woken by the reclaim, may have claimed the unit already:
	// one creation may be its.
	if ks := mpKS(snap, adv49KeyWake); ks.Live != 0 || ks.Creating > 1 || len(snap.Lanes) != 1 {
		t.Fatalf("after reclaim: %d lanes, key %+v; want 1 lane and an empty budget", len(snap.Lanes), ks)
	}
	select {
	case r := <-res:
		if r.err != nil {
			t.Fatalf("the key's budget is free since the dead process's lane was reclaimed, yet the waiter was never woken: Acquire failed %v later: %v", r.at.Sub(start).Round(time.Millisecond), r.err)
		}
		if r.plan.Kind != PlanCreate {
			t.Fatalf("Acquire: %v, want a creation", r.plan.Kind)
		}
		r.plan.Permit.Close()
	case <-time.After(5 * time.Second):
		t.Fatalf("Acquire did not return")
	}
}
