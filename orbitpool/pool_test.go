package orbitpool

import (
	"context"
	"errors"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// testOpts keeps housekeeping fast so that tests of it need not wait long.
var testOpts = Options{ReconcileInterval: 10 * time.Millisecond, ReservationTimeout: 50 * time.Millisecond}

func openMem(t testing.TB, spec PoolSpec) *Pool {
	t.Helper()
	return openMemOpts(t, spec, testOpts)
}

func openMemOpts(t testing.TB, spec PoolSpec, opts Options) *Pool {
	t.Helper()
	p, err := Open(spec, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// openShared opens n pools (lanes) on one segment file in a temporary dir.
func openShared(t testing.TB, spec PoolSpec, n int) []*Pool {
	t.Helper()
	return openSharedOpts(t, spec, n, testOpts)
}

// openSharedOpts is openShared with opts.
func openSharedOpts(t testing.TB, spec PoolSpec, n int, opts Options) []*Pool {
	t.Helper()
	if spec.Path == "" {
		spec.Path = filepath.Join(t.TempDir(), "seg")
	}
	open := opener(t, spec, opts)
	var ps []*Pool
	for range n {
		ps = append(ps, open())
	}
	return ps
}

// opener returns a function that opens a member of the fleet of spec with
// opts, closed when t ends.
func opener(t testing.TB, spec PoolSpec, opts Options) func() *Pool {
	return func() *Pool {
		t.Helper()
		p, err := Open(spec, opts)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		return p
	}
}

var small = PoolSpec{Lanes: 4, Keys: 16, ResourcesPerLane: 16}

// backings runs f over process memory and over a shared segment.
func backings(t *testing.T, f func(t *testing.T, p *Pool)) {
	backingsOpts(t, testOpts, f)
}

// backingsOpts is backings with opts.
func backingsOpts(t *testing.T, opts Options, f func(t *testing.T, p *Pool)) {
	t.Run("memory", func(t *testing.T) { f(t, openMemOpts(t, small, opts)) })
	t.Run("shared", func(t *testing.T) { f(t, openSharedOpts(t, small, 1, opts)[0]) })
}

// noAging is testOpts for a test that counts reservations exactly: a
// reservation it holds is never aged out, however long a loaded machine
// keeps it from being accepted.
var noAging = Options{ReconcileInterval: testOpts.ReconcileInterval, ReservationTimeout: time.Hour}

func TestReserveAcceptComplete(t *testing.T) {
	backingsOpts(t, noAging, func(t *testing.T, p *Pool) {
		k := Key{1, 2}
		id, err := p.Register(k, 2)
		if err != nil {
			t.Fatal(err)
		}
		if id.Lane() != p.Lane() || id.Generation() == 0 {
			t.Fatalf("id %v: want lane %d and a nonzero generation", id, p.Lane())
		}
		l1, err := p.Reserve(id)
		if err != nil {
			t.Fatal(err)
		}
		l2, err := p.Reserve(id)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := p.Reserve(id); !errors.Is(err, ErrBusy) {
			t.Fatalf("third reserve on capacity 2: %v, want ErrBusy", err)
		}
		cs, err := p.Candidates(k, nil)
		if err != nil || len(cs) != 1 || cs[0].Pending != 2 || cs[0].InUse != 0 || !cs[0].Local || cs[0].Room() != 0 {
			t.Fatalf("candidates %+v, %v: want one local with 2 pending", cs, err)
		}
		e1, err := p.Accept(l1)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := p.Accept(l1); !errors.Is(err, ErrStale) {
			t.Fatalf("second accept of one lease: %v, want ErrStale", err)
		}
		e2, err := p.Accept(l2)
		if err != nil {
			t.Fatal(err)
		}
		cs, _ = p.Candidates(k, cs[:0])
		if cs[0].InUse != 2 || cs[0].Pending != 0 {
			t.Fatalf("after accepts: %+v", cs[0])
		}
		e1.Complete()
		e1.Complete() // harmless
		if _, err := p.Reserve(id); err != nil {
			t.Fatalf("reserve after one complete: %v", err)
		}
		e2.Close()
		cs, _ = p.Candidates(k, cs[:0])
		if cs[0].InUse != 0 || cs[0].Pending != 1 {
			t.Fatalf("after completes: %+v, want 0 in use, 1 pending", cs[0])
		}
	})
}

func TestAcceptRefusesForeignAndStaleLeases(t *testing.T) {
	ps := openShared(t, small, 2)
	a, b := ps[0], ps[1]
	k := Key{3, 4}
	id, err := a.Register(k, 4)
	if err != nil {
		t.Fatal(err)
	}
	l, err := b.Reserve(id)
	if err != nil {
		t.Fatal(err)
	}
	if l.Owner != a.Incarnation() {
		t.Fatalf("lease owner %#x, want owner's incarnation %#x", l.Owner, a.Incarnation())
	}
	if _, err := b.Accept(l); !errors.Is(err, ErrNotOwner) {
		t.Fatalf("accept by non-owner: %v, want ErrNotOwner", err)
	}
	forged := l
	forged.Owner++
	if _, err := a.Accept(forged); !errors.Is(err, ErrStale) {
		t.Fatalf("accept of another incarnation's lease: %v, want ErrStale", err)
	}
	forged = l
	forged.Ticket++
	if _, err := a.Accept(forged); !errors.Is(err, ErrStale) {
		t.Fatalf("accept with a forged ticket: %v, want ErrStale", err)
	}
	forged = l
	forged.Bit = (l.Bit + 1) % PendingReservations
	if _, err := a.Accept(forged); !errors.Is(err, ErrStale) {
		t.Fatalf("accept naming an unreserved bit: %v, want ErrStale", err)
	}
	forged = l
	forged.ID = makeID(a.Lane(), small.ResourcesPerLane+3, 1)
	if _, err := a.Accept(forged); !errors.Is(err, ErrStale) {
		t.Fatalf("accept of an out-of-range slot: %v, want ErrStale", err)
	}
	e, err := a.Accept(l)
	if err != nil {
		t.Fatalf("genuine lease after forgeries: %v", err)
	}
	e.Complete()

	// A lease on a slot that was unregistered and reused is stale (no ABA).
	l2, err := b.Reserve(id)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Unregister(id); err != nil {
		t.Fatal(err)
	}
	id2, err := a.Register(k, 4)
	if err != nil {
		t.Fatal(err)
	}
	if id2.Slot() != id.Slot() || id2.Generation() == id.Generation() {
		t.Fatalf("reused slot: old %v new %v, want same slot, new generation", id, id2)
	}
	if _, err := a.Accept(l2); !errors.Is(err, ErrStale) {
		t.Fatalf("lease from before the slot's reuse: %v, want ErrStale", err)
	}
	if _, err := b.Reserve(id); !errors.Is(err, ErrStale) {
		t.Fatalf("reserve on the old id: %v, want ErrStale", err)
	}
	if err := a.Unregister(id); !errors.Is(err, ErrStale) {
		t.Fatalf("unregister of the old id: %v, want ErrStale", err)
	}
	if err := b.Unregister(id2); !errors.Is(err, ErrNotOwner) {
		t.Fatalf("unregister by non-owner: %v, want ErrNotOwner", err)
	}
}

func TestPendingReservationsAreBounded(t *testing.T) {
	backings(t, func(t *testing.T, p *Pool) {
		id, err := p.Register(Key{5, 5}, 100)
		if err != nil {
			t.Fatal(err)
		}
		seen := map[uint8]bool{}
		for range PendingReservations {
			l, err := p.Reserve(id)
			if err != nil {
				t.Fatal(err)
			}
			if seen[l.Bit] {
				t.Fatalf("bit %d handed out twice", l.Bit)
			}
			seen[l.Bit] = true
		}
		if _, err := p.Reserve(id); !errors.Is(err, ErrBusy) {
			t.Fatalf("reservation %d: %v, want ErrBusy", PendingReservations+1, err)
		}
	})
}

func TestClaimCreateCountsLiveAndCreatingFleetWide(t *testing.T) {
	ps := openShared(t, small, 2)
	a, b := ps[0], ps[1]
	k := Key{6, 6}
	lim := Limits{MaxResources: 3, MaxCreating: 2}
	pa, err := a.ClaimCreate(k, lim)
	if err != nil {
		t.Fatal(err)
	}
	pb, err := b.ClaimCreate(k, lim)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.ClaimCreate(k, lim); !errors.Is(err, ErrBudget) {
		t.Fatalf("third concurrent creation with MaxCreating 2: %v, want ErrBudget", err)
	}
	if _, err := pa.Register(1); err != nil {
		t.Fatal(err)
	}
	if _, err := pa.Register(1); err == nil {
		t.Fatal("a permit registered twice")
	}
	pa2, err := b.ClaimCreate(k, lim)
	if err != nil {
		t.Fatalf("creation after one registered: %v", err)
	}
	// 1 live + 2 creating = 3 = MaxResources.
	if _, err := a.ClaimCreate(k, Limits{MaxResources: 3}); !errors.Is(err, ErrBudget) {
		t.Fatalf("creation past MaxResources counting creating ones: %v, want ErrBudget", err)
	}
	pb.Close()
	pb.Close() // harmless
	if _, err := pb.Register(1); err == nil {
		t.Fatal("a closed permit registered")
	}
	pc, err := a.ClaimCreate(k, Limits{MaxResources: 3})
	if err != nil {
		t.Fatalf("closed permit did not give its unit back: %v", err)
	}
	pc.Close()
	pa2.Close()
	snap, err := a.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if len(snap.Keys) != 1 || snap.Keys[0].Live != 1 || snap.Keys[0].Creating != 0 || snap.Keys[0].Created != 1 {
		t.Fatalf("snapshot %+v: want 1 live, 0 creating, 1 created", snap.Keys)
	}
}

func TestRegisterAndAcceptKeepsTheResource(t *testing.T) {
	backings(t, func(t *testing.T, p *Pool) {
		cp, err := p.ClaimCreate(Key{7, 7}, Limits{MaxResources: 1})
		if err != nil {
			t.Fatal(err)
		}
		e, err := cp.RegisterAndAccept(1)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := p.Reserve(e.ID()); !errors.Is(err, ErrBusy) {
			t.Fatalf("reserve on a resource its creator holds: %v, want ErrBusy", err)
		}
		e.Complete()
		if _, err := p.Reserve(e.ID()); err != nil {
			t.Fatalf("reserve after complete: %v", err)
		}
	})
}

func TestRegisterRejectsBadCapacity(t *testing.T) {
	p := openMem(t, small)
	for _, c := range []int{0, -1, MaxCapacity + 1} {
		if _, err := p.Register(Key{1, 1}, c); err == nil {
			t.Errorf("capacity %d accepted", c)
		}
	}
	snap, _ := p.Snapshot()
	for _, k := range snap.Keys {
		if k.Live+k.Creating != 0 {
			t.Fatalf("failed registrations left %+v", k)
		}
	}
}

func TestUnregisterInvalidatesAndReturnsBudget(t *testing.T) {
	backings(t, func(t *testing.T, p *Pool) {
		k := Key{8, 8}
		lim := Limits{MaxResources: 1}
		cp, err := p.ClaimCreate(k, lim)
		if err != nil {
			t.Fatal(err)
		}
		e, err := cp.RegisterAndAccept(2)
		if err != nil {
			t.Fatal(err)
		}
		l, err := p.Reserve(e.ID())
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Unregister(e.ID()); err != nil {
			t.Fatal(err)
		}
		e.Complete() // a no-op now; must not disturb the freed slot
		if _, err := p.Accept(l); !errors.Is(err, ErrStale) {
			t.Fatalf("accept after unregister: %v, want ErrStale", err)
		}
		if cs, _ := p.Candidates(k, nil); len(cs) != 0 {
			t.Fatalf("candidates after unregister: %+v", cs)
		}
		cp, err = p.ClaimCreate(k, lim)
		if err != nil {
			t.Fatalf("budget not returned by unregister: %v", err)
		}
		cp.Close()
	})
}

func TestReconcileAgesUnacceptedReservations(t *testing.T) {
	backings(t, func(t *testing.T, p *Pool) {
		k := Key{9, 9}
		id, err := p.Register(k, 1)
		if err != nil {
			t.Fatal(err)
		}
		l, err := p.Reserve(id)
		if err != nil {
			t.Fatal(err)
		}
		// A caller that gives up frees nothing: only the owner's
		// Reconcile does, once the reservation is older than the timeout.
		deadline := time.Now().Add(5 * time.Second)
		for {
			if _, err := p.Reserve(id); err == nil {
				break
			} else if !errors.Is(err, ErrBusy) {
				t.Fatal(err)
			}
			if time.Now().After(deadline) {
				t.Fatal("reservation never aged out")
			}
			time.Sleep(5 * time.Millisecond)
		}
		if _, err := p.Accept(l); !errors.Is(err, ErrStale) {
			t.Fatalf("accept of an aged-out lease: %v, want ErrStale", err)
		}
		snap, _ := p.Snapshot()
		if snap.Keys[0].Aged != 1 {
			t.Fatalf("aged count %d, want 1", snap.Keys[0].Aged)
		}
	})
}

func TestAcquirePlans(t *testing.T) {
	ps := openShared(t, small, 2)
	a, b := ps[0], ps[1]
	ctx := context.Background()
	k := Key{10, 10}
	lim := Limits{MaxResources: 2}

	plan, err := a.Acquire(ctx, k, nil, lim)
	if err != nil || plan.Kind != PlanCreate {
		t.Fatalf("empty key: %v %v, want a create plan", plan.Kind, err)
	}
	ea, err := plan.Permit.RegisterAndAccept(1)
	if err != nil {
		t.Fatal(err)
	}
	ea.Complete()

	plan, err = a.Acquire(ctx, k, LocalFirst{}, lim)
	if err != nil || plan.Kind != PlanReuseLocal || plan.Execution.ID() != ea.ID() {
		t.Fatalf("local idle resource: %v %v, want reuse-local of %v", plan.Kind, err, ea.ID())
	}
	held := plan.Execution

	// b sees a's resource busy and may create.
	plan, err = b.Acquire(ctx, k, LocalFirst{}, lim)
	if err != nil || plan.Kind != PlanCreate {
		t.Fatalf("busy remote, budget left: %v %v, want create", plan.Kind, err)
	}
	eb, err := plan.Permit.Register(1)
	if err != nil {
		t.Fatal(err)
	}

	// a's own resource is busy; b's is idle: LocalFirst reserves b's.
	plan, err = a.Acquire(ctx, k, LocalFirst{}, lim)
	if err != nil || plan.Kind != PlanReuseRemote || plan.Lease.ID != eb {
		t.Fatalf("idle remote: %v %v, want reuse-remote of %v", plan.Kind, err, eb)
	}
	ex, err := b.Accept(plan.Lease)
	if err != nil {
		t.Fatal(err)
	}

	// LocalOnly never sees b's resource; with the budget spent it waits.
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	_, err = a.Acquire(short, k, LocalOnly{}, lim)
	var we *WaitError
	if !errors.As(err, &we) || !errors.Is(err, context.DeadlineExceeded) || we.Reason != ReasonBusy {
		t.Fatalf("everything busy: %v, want a WaitError (busy) wrapping DeadlineExceeded", err)
	}
	held.Complete()
	ex.Complete()
	snap, _ := a.Snapshot()
	ks := snap.Keys[0]
	if ks.ReusedLocal != 1 || ks.ReusedRemote != 1 || ks.Accepted != 1 || ks.Timeouts != 1 || ks.Created != 2 {
		t.Fatalf("counters %+v", ks)
	}
	if ks.Idle != 2 || ks.Busy != 0 || ks.Waiting != 0 {
		t.Fatalf("gauges %+v: want 2 idle", ks)
	}
}

// TestCreateBeforeRemote: with a sibling's resource idle, CreateBeforeRemote
// creates while the budget allows, then reserves the sibling's, and takes a
// local resource with room before either.
func TestCreateBeforeRemote(t *testing.T) {
	ps := openShared(t, small, 2)
	a, b := ps[0], ps[1]
	ctx := context.Background()
	k := Key{11, 11}
	lim := Limits{MaxResources: 2}

	plan, err := b.Acquire(ctx, k, nil, lim)
	if err != nil || plan.Kind != PlanCreate {
		t.Fatalf("empty key: %v %v, want a create plan", plan.Kind, err)
	}
	idB, err := plan.Permit.Register(1)
	if err != nil {
		t.Fatal(err)
	}

	plan, err = a.Acquire(ctx, k, CreateBeforeRemote{}, lim)
	if err != nil || plan.Kind != PlanCreate {
		t.Fatalf("idle remote, budget left: %v %v, want create", plan.Kind, err)
	}
	ea, err := plan.Permit.RegisterAndAccept(1)
	if err != nil {
		t.Fatal(err)
	}
	ea.Complete()

	plan, err = a.Acquire(ctx, k, CreateBeforeRemote{}, lim)
	if err != nil || plan.Kind != PlanReuseLocal || plan.Execution.ID() != ea.ID() {
		t.Fatalf("local idle resource: %v %v, want reuse-local of %v", plan.Kind, err, ea.ID())
	}
	held := plan.Execution
	defer held.Complete()

	plan, err = a.Acquire(ctx, k, CreateBeforeRemote{}, lim)
	if err != nil || plan.Kind != PlanReuseRemote || plan.Lease.ID != idB {
		t.Fatalf("budget spent, remote idle: %v %v, want reuse-remote of %v", plan.Kind, err, idB)
	}
	ex, err := b.Accept(plan.Lease)
	if err != nil {
		t.Fatal(err)
	}
	ex.Complete()
}

type refuseAll struct{}

func (refuseAll) Decide(*View) Decision { return Decision{Action: ActionRefuse, Reason: ReasonPolicy} }

func TestAcquireRefusal(t *testing.T) {
	p := openMem(t, small)
	_, err := p.Acquire(context.Background(), Key{1, 1}, refuseAll{}, Limits{})
	var re *RefusedError
	if !errors.Is(err, ErrRefused) || !errors.As(err, &re) || re.Reason != ReasonPolicy {
		t.Fatalf("refusing policy: %v", err)
	}
}

func TestWaiterWokenByComplete(t *testing.T) {
	backings(t, func(t *testing.T, p *Pool) {
		k := Key{11, 11}
		lim := Limits{MaxResources: 1}
		plan, err := p.Acquire(context.Background(), k, nil, lim)
		if err != nil {
			t.Fatal(err)
		}
		e, err := plan.Permit.RegisterAndAccept(1)
		if err != nil {
			t.Fatal(err)
		}
		const waiters = 20
		got := make(chan Plan, waiters)
		errs := make(chan error, waiters)
		for range waiters {
			go func() {
				plan, err := p.Acquire(context.Background(), k, nil, lim)
				if err != nil {
					errs <- err
					return
				}
				got <- plan
			}()
		}
		waitFor(t, func() bool { s, _ := p.Snapshot(); return s.Keys[0].Waiting == waiters })
		// Each completion hands the resource to exactly one waiter.
		e.Complete()
		for i := range waiters {
			select {
			case plan := <-got:
				if plan.Kind != PlanReuseLocal || plan.Waited <= 0 {
					t.Fatalf("waiter %d: plan %v waited %v", i, plan.Kind, plan.Waited)
				}
				plan.Execution.Complete()
			case err := <-errs:
				t.Fatal(err)
			case <-time.After(5 * time.Second):
				t.Fatalf("waiter %d never woke", i)
			}
		}
		snap, _ := p.Snapshot()
		if ks := snap.Keys[0]; ks.Waiting != 0 || ks.Waits != waiters || ks.InUse != 0 {
			t.Fatalf("after all waiters: %+v", ks)
		}
	})
}

func TestCreationBudgetReturnWakesWaiter(t *testing.T) {
	p := openMem(t, small)
	k := Key{12, 12}
	lim := Limits{MaxResources: 1}
	cp, err := p.ClaimCreate(k, lim)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		plan, err := p.Acquire(context.Background(), k, nil, lim)
		if err == nil && plan.Kind != PlanCreate {
			err = errors.New("woken waiter did not get the creation budget")
		}
		if err == nil {
			plan.Permit.Close()
		}
		done <- err
	}()
	waitFor(t, func() bool { s, _ := p.Snapshot(); return s.Keys[0].Waiting == 1 })
	cp.Close() // a failed creation gives its unit back and wakes the key
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("waiter not woken by a returned creation unit")
	}
}

func TestCloseReleasesEverythingToSiblings(t *testing.T) {
	ps := openShared(t, small, 2)
	a, b := ps[0], ps[1]
	k := Key{13, 13}
	lim := Limits{MaxResources: 2}
	if _, err := a.Register(k, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := a.ClaimCreate(k, lim); err != nil {
		t.Fatal(err)
	}
	waitErr := make(chan error, 1)
	go func() {
		_, err := a.Acquire(context.Background(), Key{14, 14}, nil, Limits{MaxResources: 0, MaxCreating: 0})
		waitErr <- err
	}()
	if _, err := b.ClaimCreate(k, lim); !errors.Is(err, ErrBudget) {
		t.Fatalf("budget with a's resource and permit: %v, want ErrBudget", err)
	}
	a.Close()
	if err := <-waitErr; err != nil && !errors.Is(err, ErrClosed) {
		// The create plan for key 14 may have won before Close; either way
		// nothing is left parked.
		t.Fatalf("waiter on a closed pool: %v", err)
	}
	for range 2 {
		if _, err := b.ClaimCreate(k, lim); err != nil {
			t.Fatalf("budget after a closed: %v", err)
		}
	}
	snap, _ := b.Snapshot()
	if len(snap.Lanes) != 1 || snap.Lanes[0].Lane != b.Lane() {
		t.Fatalf("lanes after close: %+v", snap.Lanes)
	}
	if _, err := a.Register(k, 1); !errors.Is(err, ErrClosed) {
		t.Fatalf("register on closed pool: %v", err)
	}
}

func TestDeadLaneIsReclaimed(t *testing.T) {
	ps := openShared(t, small, 2)
	a, b := ps[0], ps[1]
	k := Key{15, 15}
	lim := Limits{MaxResources: 2}
	id, err := a.Register(k, 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.ClaimCreate(k, lim); err != nil {
		t.Fatal(err)
	}
	bid, err := b.Register(Key{16, 16}, 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Reserve(bid); err != nil {
		t.Fatal(err)
	}
	simulateDeath(a)

	waitFor(t, func() bool {
		_, err := b.ClaimCreate(k, Limits{MaxResources: 2})
		return err == nil
	})
	if _, err := b.Reserve(id); !errors.Is(err, ErrStale) {
		t.Fatalf("dead lane's resource: %v, want ErrStale", err)
	}
	// The dead process's reservation on b's resource goes with it.
	waitFor(t, func() bool { _, err := b.Reserve(bid); return err == nil })
}

func TestKeyTableFullAndCollected(t *testing.T) {
	p := openMem(t, PoolSpec{Lanes: 1, Keys: 4, ResourcesPerLane: 8})
	var ids []ResourceID
	for i := range 4 {
		id, err := p.Register(Key{0, uint64(i)}, 1)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	if _, err := p.Register(Key{0, 99}, 1); !errors.Is(err, ErrFull) {
		t.Fatalf("fifth key in a table of four: %v, want ErrFull", err)
	}
	if err := p.Unregister(ids[1]); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Register(Key{0, 99}, 1); err != nil {
		t.Fatalf("key after one was freed: %v", err)
	}
	for _, i := range []int{0, 2, 3} {
		cs, err := p.Candidates(Key{0, uint64(i)}, nil)
		if err != nil || len(cs) != 1 || cs[0].ID != ids[i] {
			t.Fatalf("key %d after collection: %+v %v", i, cs, err)
		}
	}
	if cs, _ := p.Candidates(Key{0, 1}, nil); len(cs) != 0 {
		t.Fatalf("collected key still has candidates: %+v", cs)
	}
}

func TestLaneSlotsFull(t *testing.T) {
	p := openMem(t, PoolSpec{Lanes: 1, Keys: 4, ResourcesPerLane: 2})
	for range 2 {
		if _, err := p.Register(Key{1, 1}, 1); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := p.ClaimCreate(Key{1, 1}, Limits{}); !errors.Is(err, ErrFull) {
		t.Fatalf("third slot of two: %v, want ErrFull", err)
	}
	snap, _ := p.Snapshot()
	if snap.Keys[0].Live != 2 || snap.Keys[0].Creating != 0 {
		t.Fatalf("failed claim left %+v", snap.Keys[0])
	}
}

func TestLanesFull(t *testing.T) {
	spec := PoolSpec{Path: filepath.Join(t.TempDir(), "seg"), Lanes: 2, Keys: 4, ResourcesPerLane: 2}
	openShared(t, spec, 2)
	_, err := Open(spec, testOpts)
	if !errors.Is(err, ErrFull) {
		t.Fatalf("third process on two lanes: %v, want ErrFull", err)
	}
	if !strings.Contains(err.Error(), "raise PoolSpec.Lanes") {
		t.Errorf("the error does not say what to change: %v", err)
	}
}

// TestLanesBeyond64: a fleet of more than 64 lanes (two words per key mask)
// wakes a waiter in a lane past the first word, serves waiters in ticket
// order across the words, and finds a sibling's room there.
func TestLanesBeyond64(t *testing.T) {
	const lanes = 70
	ps := openShared(t, PoolSpec{Lanes: lanes, Keys: 4, ResourcesPerLane: 2}, lanes)
	last := ps[lanes-1]
	if last.Lane() != lanes-1 {
		t.Fatalf("last pool has lane %d", last.Lane())
	}
	k := Key{65, 65}
	id, err := ps[0].Register(k, 1)
	if err != nil {
		t.Fatal(err)
	}
	plan, err := ps[0].Acquire(context.Background(), k, LocalOnly{}, Limits{MaxResources: 1})
	if err != nil || plan.Kind != PlanReuseLocal {
		t.Fatalf("%v %v", plan.Kind, err)
	}
	// Waiters in lanes 69, 3 and 66, in that order, each waiting for a
	// sibling's resource.
	order := []int{lanes - 1, 3, 66}
	got := make(chan int, len(order))
	for i, l := range order {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			plan, err := ps[l].Acquire(ctx, k, LocalFirst{}, Limits{MaxResources: 1})
			if err != nil || plan.Kind != PlanReuseRemote {
				t.Errorf("lane %d: %v %v", l, plan.Kind, err)
				got <- -1
				return
			}
			e, err := ps[0].Accept(plan.Lease)
			if err != nil {
				t.Errorf("lane %d: accept: %v", l, err)
				got <- -1
				return
			}
			got <- l
			time.Sleep(5 * time.Millisecond)
			e.Complete()
		}()
		waitFor(t, func() bool { return keyStats(t, ps[0], k).Waiting == i+1 })
	}
	plan.Execution.Complete()
	for i, want := range order {
		if l := <-got; l != want {
			t.Fatalf("served %d-th: lane %d, want lane %d", i, l, want)
		}
	}
	if err := ps[0].Unregister(id); err != nil {
		t.Fatal(err)
	}
	// A resource in lane 69 with room, found from lane 0.
	if _, err := last.Register(k, 1); err != nil {
		t.Fatal(err)
	}
	plan, err = ps[0].Acquire(context.Background(), k, LocalFirst{}, Limits{})
	if err != nil || plan.Kind != PlanReuseRemote || plan.Lease.ID.Lane() != lanes-1 {
		t.Fatalf("%v %v %v", plan.Kind, plan.Lease.ID, err)
	}
}

func TestCorruptListIsAnErrorNotACrash(t *testing.T) {
	p := openShared(t, small, 1)[0]
	k := Key{17, 17}
	if _, err := p.Register(k, 1); err != nil {
		t.Fatal(err)
	}
	ref, _ := p.lookupKey(k)
	s := p.seg
	*s.u32(s.headOff(p.Lane(), ref.idx)) = uint32(small.ResourcesPerLane + 7)
	if _, err := p.Candidates(k, nil); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("list pointing past the lane: %v, want ErrCorrupt", err)
	}
	if _, err := p.Acquire(context.Background(), k, nil, Limits{}); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("acquire over a corrupt list: %v, want ErrCorrupt", err)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 5s")
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func TestGenerationWrapsPastZero(t *testing.T) {
	p := openMem(t, PoolSpec{Lanes: 1, Keys: 4, ResourcesPerLane: 1})
	s := p.seg
	word := s.u64(s.slotOff(p.Lane(), 0) + slWord)
	*word = slotWord(genMask, StateFree, 0, 0) // the last generation before wrapping
	id, err := p.Register(Key{1, 1}, 1)
	if err != nil {
		t.Fatal(err)
	}
	if id.Generation() != genMask {
		t.Fatalf("generation %d, want %d", id.Generation(), uint64(genMask))
	}
	l, err := p.Reserve(id)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Unregister(id); err != nil {
		t.Fatal(err)
	}
	id2, err := p.Register(Key{1, 1}, 1)
	if err != nil {
		t.Fatal(err)
	}
	if id2.Generation() != 1 {
		t.Fatalf("generation after wrap %d, want 1 (0 is never live)", id2.Generation())
	}
	if _, err := p.Accept(l); !errors.Is(err, ErrStale) {
		t.Fatalf("lease from before the wrap: %v, want ErrStale", err)
	}
}

func TestReclaimIsReported(t *testing.T) {
	path := filepath.Join(t.TempDir(), "seg")
	reclaimed := make(chan LaneInfo, 1)
	opts := testOpts
	opts.OnReclaim = func(li LaneInfo) { reclaimed <- li }
	b, err := Open(PoolSpec{Path: path, Lanes: 2, Keys: 4, ResourcesPerLane: 4}, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	a := openShared(t, PoolSpec{Path: path, Lanes: 2, Keys: 4, ResourcesPerLane: 4}, 1)[0]
	for i := range 3 {
		if _, err := a.Register(Key{9, uint64(i % 2)}, 1); err != nil {
			t.Fatal(err)
		}
	}
	simulateDeath(a)
	select {
	case li := <-reclaimed:
		if li.Lane != a.Lane() || li.Incarnation != a.Incarnation() || li.Resources != 3 {
			t.Fatalf("reclaimed %+v, want lane %d incarnation %#x with 3 resources", li, a.Lane(), a.Incarnation())
		}
	case <-time.After(5 * time.Second):
		t.Fatal("reclaim not reported")
	}
}

// simulateDeath makes p look, to its siblings, like a process killed with
// SIGKILL: its mapping and file description go away (the mapping holds the
// description, and with it the lane lock) and nothing is cleaned up.
func simulateDeath(p *Pool) {
	p.closed.Store(true)
	close(p.stop)
	p.ring(p.Lane())
	<-p.finished
	p.seg.close()
	// p's cleanup closes the segment too; without this it can run once p
	// is last read above, while close is still at work.
	runtime.KeepAlive(p)
}

func TestWatchInASelect(t *testing.T) {
	ps := openShared(t, small, 2)
	a, b := ps[0], ps[1]
	k := Key{18, 18}
	id, err := a.Register(k, 1)
	if err != nil {
		t.Fatal(err)
	}
	l, err := a.Reserve(id)
	if err != nil {
		t.Fatal(err)
	}
	e, err := a.Accept(l)
	if err != nil {
		t.Fatal(err)
	}
	r, err := b.Watch(k)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if _, err := b.Reserve(id); !errors.Is(err, ErrBusy) { // the re-check
		t.Fatalf("re-check: %v, want ErrBusy", err)
	}
	select {
	case <-r.Ready():
		t.Fatal("ready before anything returned")
	case <-time.After(20 * time.Millisecond):
	}
	e.Complete()
	select {
	case <-r.Ready():
	case <-time.After(5 * time.Second):
		t.Fatal("a Complete in another lane did not wake the watcher")
	}
	if _, err := b.Reserve(id); err != nil {
		t.Fatalf("reserve after wake: %v", err)
	}
}

func TestTagIsPublished(t *testing.T) {
	path := filepath.Join(t.TempDir(), "seg")
	spec := PoolSpec{Path: path, Lanes: 2, Keys: 4, ResourcesPerLane: 4}
	opts := testOpts
	opts.Tag = 0xfeed
	a, err := Open(spec, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b := openShared(t, spec, 1)[0]
	snap, err := b.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	for _, li := range snap.Lanes {
		if want := map[bool]uint64{true: 0, false: 0xfeed}[li.Local]; li.Tag != want {
			t.Errorf("lane %d (local %v) tag %#x, want %#x", li.Lane, li.Local, li.Tag, want)
		}
	}
}
