package orbitpool

import (
	"context"
	"errors"
	"math/rand/v2"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// adv77cRace races, on owner, Accepts of leases, local uses through Acquire
// and Close, and reports the Executions handed out. It fails t if an
// operation begun after Close returned hands out an Execution.
func adv77cRace(t *testing.T, owner *Pool, key Key, leases []Lease, locals int, closeAfter time.Duration) []*Execution {
	t.Helper()
	var closed atomic.Bool
	var mu sync.Mutex
	var execs []*Execution
	keep := func(e *Execution, began bool, what string) {
		if e == nil {
			return
		}
		mu.Lock()
		execs = append(execs, e)
		mu.Unlock()
		if began {
			t.Errorf("%s begun after Close returned handed out an Execution", what)
		}
	}
	var wg sync.WaitGroup
	for _, l := range leases {
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(time.Duration(rand.IntN(int(closeAfter) + 1)))
			began := closed.Load()
			e, err := owner.Accept(l)
			if err != nil && !errors.Is(err, ErrClosed) && !errors.Is(err, ErrStale) {
				t.Errorf("Accept racing Close: %v, want success, ErrClosed or ErrStale", err)
			}
			keep(e, began, "an Accept")
		}()
	}
	for range locals {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				began := closed.Load()
				ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
				plan, err := owner.Acquire(ctx, key, LocalFirst{}, Limits{MaxResources: 1})
				cancel()
				if err != nil {
					return
				}
				switch plan.Kind {
				case PlanReuseLocal:
					keep(plan.Execution, began, "a local Acquire")
					if i%2 == 0 {
						// Some give their unit back at once, for churn.
						plan.Execution.Complete()
					}
				case PlanCreate:
					plan.Permit.Close()
				case PlanReuseRemote:
					t.Errorf("the owner's Acquire planned a lease on %v", plan.Lease.ID)
				}
				if began {
					return
				}
			}
		}()
	}
	time.Sleep(closeAfter / 2)
	if err := owner.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	closed.Store(true)
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Accepts and Acquires racing Close did not return within 10s")
	}
	for _, l := range leases {
		if e, err := owner.Accept(l); err == nil || e != nil {
			t.Errorf("an Accept after Close returned: %v, %v; want an error", e, err)
		}
	}
	return execs
}

// adv77cNextLife opens a pool that takes the closed owner's lane (its next
// life), registers key there with capacity, and checks that the new
// resource holds no use, reservation or ticket, also once the old life's
// Executions complete.
func adv77cNextLife(t *testing.T, spec PoolSpec, opts Options, lane int, key Key, capacity int, old []*Execution) (*Pool, ResourceID) {
	t.Helper()
	next := adv77aOpen(t, spec, opts)
	if next.lane != lane {
		t.Fatalf("the next pool took lane %d, want the closed owner's %d", next.lane, lane)
	}
	id, err := next.Register(key, capacity)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := next.Users(id); n != 0 || err != nil {
		t.Errorf("the lane's next life starts with %d users and reservations (%v), want 0", n, err)
	}
	for _, e := range old {
		e.Complete()
	}
	if n, err := next.Users(id); n != 0 || err != nil {
		t.Errorf("after the old life's %d Executions completed: %d users and reservations on the next life's resource (%v), want 0", len(old), n, err)
	}
	noTickets(t, next, id)
	return next, id
}

// TestAdv77cAcceptLocalCloseRace: leases of a sibling pool are accepted,
// and local uses taken through Acquire, by many goroutines while Close
// runs. No operation begun after Close returned hands out an Execution;
// the lane's next life sees no stray use, even once the old Executions
// complete; and its resource serves its whole capacity.
func TestAdv77cAcceptLocalCloseRace(t *testing.T) {
	const capacity = 6
	key := Key{0xa77c, 20}
	deadline := time.Now().Add(12 * time.Second)
	for it := 0; it < 25 && time.Now().Before(deadline); it++ {
		spec := PoolSpec{Lanes: 3, Keys: 4, ResourcesPerLane: 2, Path: filepath.Join(t.TempDir(), "seg")}
		opts := Options{ReconcileInterval: 2 * time.Millisecond, ReservationTimeout: time.Minute}
		owner := adv77aOpen(t, spec, opts)
		r := adv77aOpen(t, spec, opts)
		id, err := owner.Register(key, capacity)
		if err != nil {
			t.Fatal(err)
		}
		var leases []Lease
		for range 3 {
			l, err := r.Reserve(id)
			if err != nil {
				t.Fatal(err)
			}
			leases = append(leases, l)
		}
		execs := adv77cRace(t, owner, key, leases, 4, time.Duration(1+it%4)*time.Millisecond)
		for _, l := range leases {
			r.Withdraw(l) // a no-op on the old life
		}
		next, nid := adv77cNextLife(t, spec, opts, owner.lane, key, capacity, execs)
		adv77cWhole(t, next, r, []ResourceID{nid}, capacity)
		next.Close()
		r.Close()
		if t.Failed() {
			return
		}
	}
}

// TestAdv77cMPAcceptCloseRace: as TestAdv77cAcceptLocalCloseRace, with the
// leases a child process's (the reserver), which then withdraws them all
// (no-ops on the old life) and reserves the next life's resource to its
// whole capacity through the new owner.
func TestAdv77cMPAcceptCloseRace(t *testing.T) {
	const capacity = 4
	key := Key{0xa77c, 21}
	for it := range 3 {
		spec := PoolSpec{Lanes: 3, Keys: 4, ResourcesPerLane: 2, Path: filepath.Join(t.TempDir(), "seg")}
		opts := Options{ReconcileInterval: 2 * time.Millisecond, ReservationTimeout: time.Minute}
		owner := adv77aOpen(t, spec, opts)
		id, err := owner.Register(key, capacity)
		if err != nil {
			t.Fatal(err)
		}
		c := mpStart(t, "adv77a-reserver", mpArgs{Spec: spec, Reconcile: opts.ReconcileInterval, ResTimeout: opts.ReservationTimeout, Lifetime: 25 * time.Second})
		c.expect("ready", 10*time.Second)
		reserve := func(id ResourceID) (Lease, string) {
			t.Helper()
			c.send(mpMsg{Type: "reserve", IDs: []ResourceID{id}})
			m := c.expect("lease", 10*time.Second)
			if m.Err != "" {
				return Lease{}, m.Err
			}
			var l Lease
			if err := l.UnmarshalBinary(m.Lease); err != nil {
				t.Fatal(err)
			}
			return l, ""
		}
		var leases []Lease
		for range 3 {
			l, e := reserve(id)
			if e != "" {
				t.Fatalf("the child's reservation: %s", e)
			}
			leases = append(leases, l)
		}
		execs := adv77cRace(t, owner, key, leases, 3, time.Duration(1+it)*time.Millisecond)
		for _, l := range leases {
			b, _ := l.MarshalBinary()
			c.send(mpMsg{Type: "withdraw", Lease: b})
			c.expect("withdrawn", 10*time.Second)
		}
		next, nid := adv77cNextLife(t, spec, opts, owner.lane, key, capacity, execs)
		var es []*Execution
		for i := range capacity {
			l, e := reserve(nid)
			if e != "" {
				t.Fatalf("the child's reservation %d of %d on the next life: %s", i+1, capacity, e)
			}
			ex, err := next.Accept(l)
			if err != nil {
				t.Fatalf("Accept of the child's lease %d on the next life: %v", i+1, err)
			}
			es = append(es, ex)
		}
		if _, e := reserve(nid); e == "" {
			t.Errorf("the child reserved past the next life's capacity of %d", capacity)
		}
		for _, ex := range es {
			ex.Complete()
		}
		// The extra reservation, if any, is withdrawn by nobody: only
		// counted above. Settle: every unit back after the child leaves.
		c.finish(10 * time.Second)
		if err := next.Reconcile(); err != nil {
			t.Errorf("Reconcile: %v", err)
		}
		if n, err := next.Users(nid); n != 0 || err != nil {
			t.Errorf("after the child left: %d users and reservations (%v), want 0", n, err)
		}
		noTickets(t, next, nid)
		next.Close()
		if t.Failed() {
			return
		}
	}
}

// TestAdv77cUseTakenAsCloseBegins: an Accept (held after its claim) and a
// local use through Acquire (held before its compare-and-swap) take their
// use while Close has begun but not yet cleared the lane (held at its
// reconcile lock). Each must refuse with ErrClosed and give the use back
// at once: the table shows no use or reservation on the resource while
// Close is still held, no ticket is left, and after Close the lane's next
// life serves its whole capacity.
func TestAdv77cUseTakenAsCloseBegins(t *testing.T) {
	for _, how := range []string{"accept", "local"} {
		t.Run(how, func(t *testing.T) {
			const capacity = 2
			key := Key{0xa77c, 30}
			spec := PoolSpec{Lanes: 3, Keys: 4, ResourcesPerLane: 2, Path: filepath.Join(t.TempDir(), "seg")}
			opts := Options{ReconcileInterval: time.Hour, ReservationTimeout: time.Minute}
			owner := adv77aOpen(t, spec, opts)
			r := adv77aOpen(t, spec, opts)
			id, err := owner.Register(key, capacity)
			if err != nil {
				t.Fatal(err)
			}
			closed := make(chan error, 1)
			var unlockOnce sync.Once
			owner.reconcileMu.Lock()
			unlock := func() { unlockOnce.Do(owner.reconcileMu.Unlock) }
			t.Cleanup(unlock)
			beginClose := func() {
				go func() { closed <- owner.Close() }()
				deadline := time.Now().Add(5 * time.Second)
				for !owner.closed.Load() {
					if time.Now().After(deadline) {
						t.Error("Close did not begin within 5s")
						return
					}
					time.Sleep(time.Millisecond)
				}
			}
			var e *Execution
			switch how {
			case "accept":
				l, err := r.Reserve(id)
				if err != nil {
					t.Fatal(err)
				}
				holdNextClaim(t, beginClose)
				e, err = owner.Accept(l)
				if !errors.Is(err, ErrClosed) {
					t.Errorf("an Accept whose use was taken after Close began: %v, %v; want ErrClosed", e, err)
				}
			case "local":
				var once atomic.Bool
				h := func(ResourceID) {
					if once.CompareAndSwap(false, true) {
						beginClose()
					}
				}
				testHookGrant.Store(&h)
				t.Cleanup(func() { testHookGrant.Store(nil) })
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				plan, err := owner.Acquire(ctx, key, LocalFirst{}, Limits{MaxResources: 1})
				cancel()
				testHookGrant.Store(nil)
				if !once.Load() {
					t.Fatalf("setup: the local use never reached the grant hook (plan %v, %v)", plan.Kind, err)
				}
				e = plan.Execution
				if err == nil || e != nil {
					t.Errorf("a local use taken after Close began: plan %v, %v; want an error", plan.Kind, err)
				}
			}
			if n, err := r.Users(id); n != 0 || err != nil {
				t.Errorf("with Close begun and the refused use given back: %d users and reservations (%v), want 0", n, err)
			}
			noTickets(t, r, id)
			unlock()
			select {
			case err := <-closed:
				if err != nil {
					t.Errorf("Close: %v", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("Close did not return within 10s")
			}
			var old []*Execution
			if e != nil {
				old = append(old, e)
			}
			next, nid := adv77cNextLife(t, spec, opts, owner.lane, key, capacity, old)
			adv77cWhole(t, next, r, []ResourceID{nid}, capacity)
		})
	}
}
