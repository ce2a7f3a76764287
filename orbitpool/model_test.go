package orbitpool

import (
	"context"
	"errors"
	"flag"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// The reference model: plain Go values that say what the table must hold
// after each operation, if the operations run one at a time.
type modelResource struct {
	owner   int // pool index
	key     Key
	cap     int
	inUse   int
	pending map[uint64]Lease // by ticket
}

type model struct {
	res      map[ResourceID]*modelResource
	creating map[Key]int
	budget   Limits
}

func (m *model) total(k Key) (total, creating int) {
	for _, r := range m.res {
		if r.key == k {
			total++
		}
	}
	return total + m.creating[k], m.creating[k]
}

// modelSeed replays a run of TestModelSequential: go test -run
// TestModelSequential ./orbitpool/ -args -orbitpool.seed N.
var modelSeed = flag.Uint64("orbitpool.seed", 0, "seed of TestModelSequential's run (0: a new one)")

// TestModelSequential applies random operations to the table and to the model
// one at a time and compares every observable after each step.
//
// The model keeps a reservation pending until the test accepts or
// withdraws it, so the owners never age one out: a run slowed down (by
// -race on a busy machine) once took longer than the tests' usual
// ReservationTimeout between a reservation and its acceptance, and the
// table then rightly held one fewer than the model.
func TestModelSequential(t *testing.T) {
	seed := *modelSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 7))
	spec := PoolSpec{Lanes: 3, Keys: 8, ResourcesPerLane: 24}
	pools := openSharedOpts(t, spec, 3, noAging)
	keys := []Key{{1, 1}, {2, 2}, {3, 3}}
	m := &model{res: map[ResourceID]*modelResource{}, creating: map[Key]int{}, budget: Limits{MaxResources: 6, MaxCreating: 2}}
	type permit struct {
		cp    *CreationPermit
		key   Key
		owner int
	}
	var (
		permits  []permit
		execs    []*Execution
		accepted []Lease
	)
	pick := func(n int) int { return rng.IntN(n) }
	resources := func() []ResourceID {
		var ids []ResourceID
		for id := range m.res {
			ids = append(ids, id)
		}
		// map order is random; sort for reproducibility from the seed
		for i := 1; i < len(ids); i++ {
			for j := i; j > 0 && ids[j] < ids[j-1]; j-- {
				ids[j], ids[j-1] = ids[j-1], ids[j]
			}
		}
		return ids
	}
	steps := 4000
	if testing.Short() {
		steps = 500
	}
	for step := range steps {
		op := pick(9)
		switch op {
		case 0: // claim creation budget
			pi, k := pick(3), keys[pick(3)]
			total, creating := m.total(k)
			want := total < m.budget.MaxResources && creating < m.budget.MaxCreating
			cp, err := pools[pi].ClaimCreate(k, m.budget)
			if (err == nil) != want || (err != nil && !errors.Is(err, ErrBudget)) {
				t.Fatalf("step %d: claim %v with total %d creating %d: %v", step, k, total, creating, err)
			}
			if err == nil {
				m.creating[k]++
				permits = append(permits, permit{cp, k, pi})
			}
		case 1: // register or abandon a permit
			if len(permits) == 0 {
				continue
			}
			i := pick(len(permits))
			pm := permits[i]
			permits = append(permits[:i], permits[i+1:]...)
			m.creating[pm.key]--
			if pick(3) == 0 {
				pm.cp.Close()
				continue
			}
			c := 1 + pick(3)
			id, err := pm.cp.Register(c)
			if err != nil {
				t.Fatalf("step %d: register: %v", step, err)
			}
			if id.Lane() != pools[pm.owner].Lane() || m.res[id] != nil {
				t.Fatalf("step %d: registered %v (owner lane %d), model has %v", step, id, pools[pm.owner].Lane(), m.res[id])
			}
			m.res[id] = &modelResource{owner: pm.owner, key: pm.key, cap: c, pending: map[uint64]Lease{}}
		case 2, 3: // reserve from any pool
			ids := resources()
			if len(ids) == 0 {
				continue
			}
			id := ids[pick(len(ids))]
			r := m.res[id]
			wantBusy := r.inUse+len(r.pending) >= r.cap || len(r.pending) >= PendingReservations
			l, err := pools[pick(3)].Reserve(id)
			if wantBusy != errors.Is(err, ErrBusy) || (!wantBusy && err != nil) {
				t.Fatalf("step %d: reserve %v (%d in use, %d pending of %d): %v", step, id, r.inUse, len(r.pending), r.cap, err)
			}
			if err == nil {
				r.pending[l.Ticket] = l
			}
		case 4: // the owner accepts a pending lease, or a forged/old one
			ids := resources()
			if len(ids) == 0 {
				continue
			}
			r := m.res[ids[pick(len(ids))]]
			if len(r.pending) == 0 || pick(4) == 0 {
				if len(accepted) > 0 {
					old := accepted[pick(len(accepted))]
					if _, err := pools[ownerOf(pools, old.ID)].Accept(old); !errors.Is(err, ErrStale) {
						t.Fatalf("step %d: lease accepted twice: %v", step, err)
					}
				}
				continue
			}
			for tk, l := range r.pending {
				e, err := pools[r.owner].Accept(l)
				if err != nil {
					t.Fatalf("step %d: accept pending lease %+v: %v", step, l, err)
				}
				delete(r.pending, tk)
				r.inUse++
				execs = append(execs, e)
				accepted = append(accepted, l)
				break
			}
		case 5: // complete an execution
			if len(execs) == 0 {
				continue
			}
			i := pick(len(execs))
			e := execs[i]
			execs = append(execs[:i], execs[i+1:]...)
			if r := m.res[e.ID()]; r != nil {
				r.inUse--
			}
			e.Complete()
		case 6: // the owner unregisters a resource
			ids := resources()
			if len(ids) == 0 {
				continue
			}
			id := ids[pick(len(ids))]
			if err := pools[m.res[id].owner].Unregister(id); err != nil {
				t.Fatalf("step %d: unregister: %v", step, err)
			}
			delete(m.res, id)
		case 7, 8: // acquire, checking the plan against what the policy may do
			pi, k := pick(3), keys[pick(3)]
			var policy Policy = LocalFirst{}
			createFirst := op == 7 && pick(2) == 0
			switch {
			case op == 8:
				policy = LocalOnly{}
			case createFirst:
				policy = CreateBeforeRemote{}
			}
			local, remote := false, false
			for _, r := range m.res {
				if r.key != k || r.inUse+len(r.pending) >= r.cap {
					continue
				}
				if r.owner == pi {
					local = true
				} else if len(r.pending) < PendingReservations {
					remote = true
				}
			}
			remote = remote && op == 7
			total, creating := m.total(k)
			canCreate := total < m.budget.MaxResources && creating < m.budget.MaxCreating
			ctx, cancel := context.WithCancel(context.Background())
			cancel() // never wait: a sequential test has nobody to wake it
			plan, err := pools[pi].Acquire(ctx, k, policy, m.budget)
			switch {
			case local:
				if err != nil || plan.Kind != PlanReuseLocal {
					t.Fatalf("step %d: local room but %v %v", step, plan.Kind, err)
				}
				m.res[plan.Execution.ID()].inUse++
				execs = append(execs, plan.Execution)
			case createFirst && canCreate:
				if err != nil || plan.Kind != PlanCreate {
					t.Fatalf("step %d: CreateBeforeRemote with budget left but %v %v", step, plan.Kind, err)
				}
				m.creating[k]++
				permits = append(permits, permit{plan.Permit, k, pi})
			case remote:
				if err != nil || plan.Kind != PlanReuseRemote {
					t.Fatalf("step %d: remote room but %v %v", step, plan.Kind, err)
				}
				m.res[plan.Lease.ID].pending[plan.Lease.Ticket] = plan.Lease
			case canCreate:
				if err != nil || plan.Kind != PlanCreate {
					t.Fatalf("step %d: budget left but %v %v", step, plan.Kind, err)
				}
				m.creating[k]++
				permits = append(permits, permit{plan.Permit, k, pi})
			default:
				var we *WaitError
				if !errors.As(err, &we) {
					t.Fatalf("step %d: nothing possible but %v %v", step, plan.Kind, err)
				}
			}
		}
		checkModel(t, step, pools, keys, m)
	}
	for _, e := range execs {
		e.Complete()
	}
	for _, pm := range permits {
		pm.cp.Close()
	}
	for id, r := range m.res {
		r.inUse = 0
		if err := pools[r.owner].Unregister(id); err != nil {
			t.Fatal(err)
		}
	}
	m.res, m.creating = map[ResourceID]*modelResource{}, map[Key]int{}
	checkModel(t, steps, pools, keys, m)
}

func ownerOf(pools []*Pool, id ResourceID) int {
	for i, p := range pools {
		if p.Lane() == id.Lane() {
			return i
		}
	}
	return 0
}

// checkModel compares every pool's view of every key with the model.
func checkModel(t *testing.T, step int, pools []*Pool, keys []Key, m *model) {
	t.Helper()
	for _, k := range keys {
		want := map[ResourceID]*modelResource{}
		for id, r := range m.res {
			if r.key == k {
				want[id] = r
			}
		}
		for pi, p := range pools {
			cs, err := p.Candidates(k, nil)
			if err != nil {
				t.Fatalf("step %d: candidates: %v", step, err)
			}
			if len(cs) != len(want) {
				t.Fatalf("step %d: pool %d sees %d resources for %v, model has %d", step, pi, len(cs), k, len(want))
			}
			for _, c := range cs {
				r := want[c.ID]
				if r == nil || c.InUse != r.inUse || c.Pending != len(r.pending) || c.Capacity != r.cap || c.Local != (r.owner == pi) {
					t.Fatalf("step %d: pool %d candidate %+v, model %+v", step, pi, c, r)
				}
				if c.InUse+c.Pending > c.Capacity {
					t.Fatalf("step %d: %+v over capacity", step, c)
				}
			}
		}
		if ref, ok := pools[0].lookupKey(k); ok {
			var v View
			pools[0].readBudget(ref, &v)
			total, creating := m.total(k)
			if v.Total != total || v.Creating != creating {
				t.Fatalf("step %d: key %v total %d creating %d, model %d %d", step, k, v.Total, v.Creating, total, creating)
			}
			if v.Total > m.budget.MaxResources {
				t.Fatalf("step %d: key %v total %d over budget %d", step, k, v.Total, m.budget.MaxResources)
			}
		}
	}
}

// TestModelConcurrent runs random operations from many goroutines over three
// lanes and checks, while they run, what must hold at every instant: no
// resource over capacity, no key over budget, no lease accepted twice; and,
// once all work is done, that nothing is left over.
func TestModelConcurrent(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	spec := PoolSpec{Lanes: 3, Keys: 8, ResourcesPerLane: 32}
	pools := openShared(t, spec, 3)
	keys := []Key{{1, 1}, {2, 2}}
	lim := Limits{MaxResources: 5, MaxCreating: 2}
	var (
		acceptedMu sync.Mutex
		accepted   = map[[2]uint64]bool{}
		failures   atomic.Int32
		stop       atomic.Bool
	)
	fail := func(format string, args ...any) {
		if failures.Add(1) == 1 {
			t.Errorf(format, args...)
		}
	}
	accept := func(owner *Pool, l Lease) *Execution {
		e, err := owner.Accept(l)
		if err != nil {
			return nil // aged out or unregistered meanwhile: allowed
		}
		acceptedMu.Lock()
		defer acceptedMu.Unlock()
		id := [2]uint64{uint64(l.ID), l.Ticket}
		if accepted[id] {
			fail("lease %+v accepted twice", l)
		}
		accepted[id] = true
		return e
	}

	var checker sync.WaitGroup
	checker.Go(func() { checkLive(pools[0], keys, lim, &stop, fail) })

	ops := 3000
	if testing.Short() {
		ops = 300
	}
	var workers sync.WaitGroup
	for g := range 12 {
		workers.Go(func() {
			rng := rand.New(rand.NewPCG(seed, uint64(g)))
			p := pools[g%3]
			for range ops {
				k := keys[rng.IntN(len(keys))]
				ctx, cancel := context.WithTimeout(context.Background(), time.Duration(rng.IntN(3))*time.Millisecond)
				plan, err := p.Acquire(ctx, k, LocalFirst{}, lim)
				cancel()
				if err != nil {
					var we *WaitError
					if !errors.As(err, &we) {
						fail("acquire: %v", err)
					}
					continue
				}
				var e *Execution
				switch plan.Kind {
				case PlanReuseLocal:
					e = plan.Execution
				case PlanReuseRemote:
					if rng.IntN(10) == 0 {
						continue // give up after reserving: the owner ages it out
					}
					e = accept(pools[ownerOf(pools, plan.Lease.ID)], plan.Lease)
					if e != nil && rng.IntN(4) == 0 {
						// a replayed lease must never be accepted again
						if e2 := accept(pools[ownerOf(pools, plan.Lease.ID)], plan.Lease); e2 != nil {
							fail("replayed lease accepted")
						}
					}
				case PlanCreate:
					if rng.IntN(5) == 0 {
						plan.Permit.Close() // the dial failed
						continue
					}
					e, err = plan.Permit.RegisterAndAccept(1 + rng.IntN(2))
					if err != nil {
						fail("register: %v", err)
						continue
					}
				}
				if e == nil {
					continue
				}
				if rng.IntN(8) == 0 {
					time.Sleep(time.Duration(rng.IntN(200)) * time.Microsecond)
				}
				if rng.IntN(6) == 0 && e.ID().Lane() == p.Lane() {
					p.Unregister(e.ID()) // the connection broke
				}
				e.Complete()
			}
		})
	}
	workers.Wait()
	stop.Store(true)
	checker.Wait()

	// Everything completed: in use 0 at once; abandoned reservations are
	// aged out by their owners within the reservation timeout.
	waitQuiet(t, pools[1], keys)
	snap, err := pools[2].Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	for _, ks := range snap.Keys {
		if ks.Creating != 0 || ks.Waiting != 0 || ks.Busy != 0 || ks.Live > lim.MaxResources {
			t.Fatalf("left over: %+v", ks)
		}
	}
	// Closing every lane leaves nothing at all.
	pools[0].Close()
	pools[1].Close()
	snap, _ = pools[2].Snapshot()
	for _, ks := range snap.Keys {
		live := 0
		cs, _ := pools[2].Candidates(ks.Key, nil)
		for _, c := range cs {
			if c.Lane != pools[2].Lane() {
				t.Fatalf("closed lane's resource still listed: %+v", c)
			}
			live++
		}
		if ks.Live != live {
			t.Fatalf("key %v: %d live, %d listed", ks.Key, ks.Live, live)
		}
	}
}

// checkLive checks, until stop, what must hold at every instant: no
// resource over its capacity and no key over its budget.
func checkLive(p *Pool, keys []Key, lim Limits, stop *atomic.Bool, fail func(string, ...any)) {
	for !stop.Load() {
		for _, k := range keys {
			cs, err := p.Candidates(k, nil)
			if err != nil {
				fail("candidates: %v", err)
			}
			for _, c := range cs {
				if c.InUse+c.Pending > c.Capacity {
					fail("%+v over capacity", c)
				}
			}
			if ref, ok := p.lookupKey(k); ok {
				var v View
				p.readBudget(ref, &v)
				if v.Total > lim.MaxResources || v.Creating > lim.MaxCreating {
					fail("key %v: total %d creating %d over %+v", k, v.Total, v.Creating, lim)
				}
			}
		}
	}
}

// waitQuiet waits until no resource of keys has a use or a reservation, as
// seen from p.
func waitQuiet(t *testing.T, p *Pool, keys []Key) {
	t.Helper()
	waitFor(t, func() bool {
		for _, k := range keys {
			cs, _ := p.Candidates(k, nil)
			for _, c := range cs {
				if c.InUse != 0 || c.Pending != 0 {
					return false
				}
			}
		}
		return true
	})
}

// maybeRefuse is a policy that, on some acquisitions, waits once and then
// refuses: it registers a waiter and leaves with an error.
type maybeRefuse struct {
	refuse bool
	calls  int
}

func (p *maybeRefuse) Decide(v *View) Decision {
	if p.refuse {
		if p.calls++; p.calls > 1 {
			return Decision{Action: ActionRefuse, Reason: ReasonPolicy}
		}
		return Decision{Action: ActionWait, Reason: ReasonBusy}
	}
	return LocalFirst{}.Decide(v)
}

// TestModelConcurrentChurn is TestModelConcurrent with the schedules that
// broke earlier tables: slots unregistered and registered again across keys
// while others scan them, lanes closing while their goroutines claim and
// register, policies that wait and then refuse, and reservers that die while
// their owners reconcile. Besides the invariants checked while it runs, every
// execution must be on a resource of the key it was acquired for, and at the
// end every key's counters must agree with the slots and no waiter, use or
// reservation may be left.
func TestModelConcurrentChurn(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	spec := PoolSpec{Lanes: 6, Keys: 256, ResourcesPerLane: 64}
	pools := openShared(t, spec, 3)
	path := pools[0].Spec().Path
	keys := []Key{{1, 1}, {2, 2}, {3, 3}}
	lim := Limits{MaxResources: 16, MaxCreating: 4}
	var (
		mu       sync.Mutex
		keyOf    = map[ResourceID]Key{}
		failures atomic.Int32
		stop     atomic.Bool
		checked  atomic.Int64
	)
	fail := func(format string, args ...any) {
		if failures.Add(1) <= 3 {
			t.Errorf(format, args...)
		}
	}
	// onKey checks that id, used for k, was made for k. Its maker records
	// it right after registering, so an unknown id is looked up again.
	onKey := func(id ResourceID, k Key) {
		for range 2000 {
			mu.Lock()
			got, ok := keyOf[id]
			mu.Unlock()
			if ok {
				if got != k {
					fail("execution for key %v on resource %v of key %v", k, id, got)
				}
				checked.Add(1)
				return
			}
			time.Sleep(5 * time.Microsecond)
		}
		fail("execution for key %v on resource %v, which was never registered", k, id)
	}
	var checker sync.WaitGroup
	checker.Go(func() { checkLive(pools[0], keys, lim, &stop, fail) })

	ops := 2000
	if testing.Short() {
		ops = 300
	}
	use := func(rng *rand.Rand, p *Pool, owners []*Pool, k Key, plan Plan) {
		var e *Execution
		switch plan.Kind {
		case PlanReuseLocal:
			e = plan.Execution
		case PlanReuseRemote:
			var owner *Pool
			for _, o := range owners {
				if o.Lane() == plan.Lease.ID.Lane() {
					owner = o
				}
			}
			if owner == nil || rng.IntN(10) == 0 {
				return // its owner left, or the reserver gives up: aged out
			}
			e, _ = owner.Accept(plan.Lease)
		case PlanCreate:
			if rng.IntN(5) == 0 {
				plan.Permit.Close()
				return
			}
			mu.Lock()
			var err error
			if e, err = plan.Permit.RegisterAndAccept(1 + rng.IntN(2)); err == nil {
				keyOf[e.ID()] = k
			}
			mu.Unlock()
			if err != nil && !errors.Is(err, ErrClosed) {
				fail("register: %v", err)
			}
		}
		if e == nil {
			return
		}
		onKey(e.ID(), k)
		if rng.IntN(8) == 0 {
			time.Sleep(time.Duration(rng.IntN(100)) * time.Microsecond)
		}
		if rng.IntN(3) == 0 && e.ID().Lane() == p.Lane() {
			p.Unregister(e.ID()) // the connection broke: its slot goes to the next key that creates
		}
		e.Complete()
	}
	acquire := func(rng *rand.Rand, p *Pool, k Key) (Plan, error) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(rng.IntN(3))*time.Millisecond)
		defer cancel()
		plan, err := p.Acquire(ctx, k, &maybeRefuse{refuse: rng.IntN(6) == 0}, lim)
		var we *WaitError
		// A lane naming fresh keys may fill its slots; the three lanes
		// sharing the budgeted keys never can.
		full := errors.Is(err, ErrFull) && p != pools[0] && p != pools[1] && p != pools[2]
		if err != nil && !errors.As(err, &we) && !errors.Is(err, ErrRefused) && !errors.Is(err, ErrClosed) && !full {
			fail("acquire: %v", err)
		}
		return plan, err
	}

	var workers sync.WaitGroup
	for g := range 9 {
		workers.Go(func() {
			rng := rand.New(rand.NewPCG(seed, uint64(g)))
			p := pools[g%3]
			own := Key{0x0f, uint64(g)} // nobody else waits on it
			for range ops {
				k := keys[rng.IntN(len(keys))]
				if rng.IntN(8) == 0 {
					k = own
				}
				plan, err := acquire(rng, p, k)
				if err == nil {
					use(rng, p, pools, k, plan)
					continue
				}
				if ref, ok := p.lookupKey(own); k == own && ok && errors.Is(err, ErrRefused) {
					if n := atomic.LoadUint32(p.seg.u32(p.seg.waitOff(p.Lane(), ref.idx))); n != 0 {
						fail("an Acquire that waited and was refused left %d waiters on a key only it uses", n)
					}
				}
			}
		})
	}
	// Lanes that join, claim from several goroutines and close mid-flight.
	workers.Go(func() {
		rng := rand.New(rand.NewPCG(seed, 100))
		for range ops / 50 {
			q, err := Open(PoolSpec{Path: path, Lanes: spec.Lanes, Keys: spec.Keys, ResourcesPerLane: spec.ResourcesPerLane}, testOpts)
			if err != nil {
				fail("open: %v", err)
				return
			}
			var inner sync.WaitGroup
			for range 3 {
				seed := rng.Uint64()
				inner.Go(func() {
					rng := rand.New(rand.NewPCG(seed, 1))
					for !q.closed.Load() {
						// Half the time a key never seen, whose naming
						// queues for the structure lock.
						k := keys[rng.IntN(len(keys))]
						if rng.IntN(2) == 0 {
							k = Key{0xc1, rng.Uint64N(1 << 40)}
						}
						if plan, err := acquire(rng, q, k); err == nil {
							use(rng, q, append([]*Pool{q}, pools...), k, plan)
						}
					}
				})
			}
			time.Sleep(time.Duration(rng.IntN(2000)) * time.Microsecond)
			q.Close()
			inner.Wait()
		}
	})
	// Reservers that die holding reservations, while owners reconcile.
	workers.Go(func() {
		rng := rand.New(rand.NewPCG(seed, 200))
		for range ops / 50 {
			q, err := Open(PoolSpec{Path: path, Lanes: spec.Lanes, Keys: spec.Keys, ResourcesPerLane: spec.ResourcesPerLane}, testOpts)
			if err != nil {
				fail("open: %v", err)
				return
			}
			for range 4 {
				cs, _ := q.Candidates(keys[rng.IntN(len(keys))], nil)
				if len(cs) > 0 {
					q.Reserve(cs[rng.IntN(len(cs))].ID)
				}
			}
			simulateDeath(q)
		}
	})
	checker.Go(func() {
		for !stop.Load() {
			for _, p := range pools {
				p.Reconcile()
			}
			runtime.Gosched()
		}
	})
	workers.Wait()
	stop.Store(true)
	checker.Wait()
	if checked.Load() == 0 {
		t.Fatal("no execution was checked for its key")
	}

	// Everything completed, dead reservers' reservations dropped, the
	// closed lanes' budget back: the counters agree with the slots.
	waitQuiet(t, pools[1], keys)
	snap, err := pools[2].Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	for _, ks := range snap.Keys {
		cs, _ := pools[2].Candidates(ks.Key, nil)
		if ks.Creating != 0 || ks.Waiting != 0 || ks.Busy != 0 || ks.Live != len(cs) || ks.Live > lim.MaxResources {
			t.Fatalf("left over: %+v with %d resources listed", ks, len(cs))
		}
	}
}
