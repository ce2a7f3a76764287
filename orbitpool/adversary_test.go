package orbitpool

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// These tests race the table's exported operations against each other the way
// a caller under load does, and check properties of what comes out: a key's
// acquisition only ever yields that key's resources, no interleaving loses a
// unit of budget or capacity, and nothing spins or parks forever.

// crossKeyRig is a pool where one goroutine keeps moving slots between two
// keys while others take units of key A, so that the LIFO free list hands a
// slot that was A's to B between a scan and a take.
type crossKeyRig struct {
	owner, other *Pool
	a, b         Key

	mu    sync.Mutex
	keyOf map[ResourceID]Key // every resource ever registered
	seen  []ResourceID       // everything taken or listed for key A
}

func (r *crossKeyRig) register(k Key) ResourceID {
	id, err := r.owner.Register(k, 2)
	if err != nil {
		panic(err)
	}
	r.mu.Lock()
	r.keyOf[id] = k
	r.mu.Unlock()
	return id
}

func (r *crossKeyRig) saw(id ResourceID) {
	r.mu.Lock()
	r.seen = append(r.seen, id)
	r.mu.Unlock()
}

func runCrossKey(t *testing.T, owner, other *Pool, d time.Duration) {
	r := &crossKeyRig{owner: owner, other: other, a: Key{0xa, 0xa}, b: Key{0xb, 0xb}, keyOf: map[ResourceID]Key{}}
	// Each of A's resources has one unit in use, so every scan must look at
	// all of them to find the least loaded.
	var ids []ResourceID
	for range 30 {
		id := r.register(r.a)
		if _, err := owner.useLocal(id, mustRef(t, owner, r.a)); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { // A's slot to B and back
		// The newest of A's resources heads its list, so a scan picks it
		// first and then walks the rest: move that one.
		i := len(ids) - 1
		for {
			select {
			case <-stop:
				return
			default:
			}
			if owner.Unregister(ids[i]) != nil {
				t.Error("unregister A failed")
				return
			}
			idb := r.register(r.b)
			owner.useLocal(idb, mustRef(t, owner, r.b))
			runtime.Gosched()
			owner.Unregister(idb)
			ids[i] = r.register(r.a)
			owner.useLocal(ids[i], mustRef(t, owner, r.a))
		}
	})
	for range 2 {
		wg.Go(func() { // the fast path
			for {
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
				// A's budget is used up: the only plan is a local use.
				plan, err := owner.Acquire(ctx, r.a, LocalOnly{}, Limits{MaxResources: 1})
				cancel()
				if err == nil {
					if plan.Kind != PlanReuseLocal {
						t.Errorf("plan %v with A's budget used up", plan.Kind)
						return
					}
					r.saw(plan.Execution.ID())
					plan.Execution.Complete()
				}
			}
		})
	}
	if other != nil {
		wg.Go(func() { // Candidates and Reserve from another lane
			var cs []Candidate
			for {
				select {
				case <-stop:
					return
				default:
				}
				cs, _ = other.Candidates(r.a, cs[:0])
				for _, c := range cs {
					r.saw(c.ID)
					if l, err := other.Reserve(c.ID); err == nil {
						r.saw(l.ID)
						if e, err := owner.Accept(l); err == nil {
							r.saw(e.ID())
							e.Complete()
						}
					}
				}
			}
		})
	}
	time.Sleep(d)
	close(stop)
	wg.Wait()
	r.mu.Lock()
	defer r.mu.Unlock()
	wrong := 0
	for _, id := range r.seen {
		if k, ok := r.keyOf[id]; !ok || k != r.a {
			wrong++
		}
	}
	if wrong > 0 || len(r.seen) == 0 {
		t.Fatalf("%d of %d resources taken or listed for key A belonged to another key", wrong, len(r.seen))
	}
}

func mustRef(t *testing.T, p *Pool, k Key) keyRef {
	ref, ok := p.lookupKey(k)
	if !ok {
		t.Fatalf("key %v not found", k)
	}
	return ref
}

func TestAcquireNeverYieldsAnotherKeysResource(t *testing.T) {
	spec := PoolSpec{Lanes: 2, Keys: 8, ResourcesPerLane: 64}
	d := 1500 * time.Millisecond
	if testing.Short() {
		d = 300 * time.Millisecond
	}
	t.Run("memory", func(t *testing.T) { runCrossKey(t, openMem(t, spec), nil, d) })
	t.Run("shared", func(t *testing.T) {
		ps := openShared(t, spec, 2)
		runCrossKey(t, ps[0], ps[1], d)
	})
}

// Close of one lane while its goroutines claim and register on new keys
// leaves no budget counted and no slot held in the lane it released.
func TestCloseRacingClaimsLeaksNothing(t *testing.T) {
	spec := PoolSpec{Lanes: 2, Keys: 256, ResourcesPerLane: 64}
	rounds := 40
	if testing.Short() {
		rounds = 10
	}
	ps := openShared(t, spec, 1)
	survivor := ps[0]
	path := survivor.Spec().Path
	var next atomic.Uint64
	for round := range rounds {
		p, err := Open(PoolSpec{Path: path, Lanes: spec.Lanes, Keys: spec.Keys, ResourcesPerLane: spec.ResourcesPerLane}, testOpts)
		if err != nil {
			t.Fatal(err)
		}
		start := make(chan struct{})
		var wg sync.WaitGroup
		for g := range 6 {
			wg.Go(func() {
				<-start
				for i := 0; ; i++ {
					// A new key each time, so that every operation also
					// queues for the structure lock to name it.
					k := Key{uint64(round), next.Add(1) % 200}
					var err error
					if g%2 == 0 {
						var cp *CreationPermit
						if cp, err = p.ClaimCreate(k, Limits{MaxResources: 4}); err == nil {
							if i%2 == 0 {
								_, err = cp.Register(1)
							} else {
								err = cp.Close()
							}
						}
					} else {
						var id ResourceID
						if id, err = p.Register(k, 1); err == nil && i%4 != 0 {
							err = p.Unregister(id)
						}
					}
					if errors.Is(err, ErrClosed) {
						return
					}
				}
			})
		}
		close(start)
		time.Sleep(time.Duration(200+rand.IntN(1000)) * time.Microsecond)
		p.Close()
		wg.Wait()
		// The closed lane holds nothing, and every key's counters agree
		// with what the live lanes hold (nothing).
		s := survivor.seg
		for i := range spec.ResourcesPerLane {
			if w := atomic.LoadUint64(s.u64(s.slotOff(p.Lane(), i) + slWord)); wState(w) != StateFree {
				t.Fatalf("round %d: slot %d of the released lane is %v", round, i, wState(w))
			}
		}
		for k := range spec.Keys {
			c := atomic.LoadUint64(s.u64(s.keyOff(k) + kfCtl))
			if kState(c) == keyLive && (kTotal(c) != 0 || kCreating(c) != 0) {
				t.Fatalf("round %d: key entry %d counts %d resources (%d creating) after its only lane closed", round, k, kTotal(c), kCreating(c))
			}
		}
		// Make room in the key table for the next round.
		s.lockStructure()
		survivor.collectKeys()
		s.unlockStructure()
	}
}

// refuseAfter waits on its first waits decisions and refuses on every later
// one.
type refuseAfter struct {
	waits int32
	calls *atomic.Int32
}

func (p refuseAfter) Decide(v *View) Decision {
	if p.calls.Add(1) <= p.waits {
		return Decision{Action: ActionWait, Reason: ReasonBusy}
	}
	return Decision{Action: ActionRefuse, Reason: ReasonPolicy}
}

// onlyUnitInUse registers a resource of k with room for one use and takes it.
func onlyUnitInUse(t *testing.T, p *Pool, k Key) *Execution {
	t.Helper()
	id, err := p.Register(k, 1)
	if err != nil {
		t.Fatal(err)
	}
	e, err := p.useLocal(id, mustRef(t, p, k))
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// An Acquire that registered as a waiter and then fails leaves no waiter
// behind to swallow the next wake-up.
func TestAcquireErrorLeavesNoWaiter(t *testing.T) {
	backings(t, func(t *testing.T, p *Pool) {
		k := Key{31, 31}
		e := onlyUnitInUse(t, p, k)
		var calls atomic.Int32
		// Refused on the re-check after registering as a waiter.
		if _, err := p.Acquire(context.Background(), k, refuseAfter{1, &calls}, Limits{}); !errors.Is(err, ErrRefused) {
			t.Fatalf("acquire: %v, want ErrRefused", err)
		}
		if ks := keyStats(t, p, k); ks.Waiting != 0 {
			t.Fatalf("%d waiters left after a refused Acquire", ks.Waiting)
		}
		got := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			plan, err := p.Acquire(ctx, k, LocalOnly{}, Limits{MaxResources: 1})
			if err == nil && plan.Kind != PlanReuseLocal {
				err = fmt.Errorf("plan %v, want the returned unit", plan.Kind)
			}
			if err == nil {
				plan.Execution.Complete()
			}
			got <- err
		}()
		waitFor(t, func() bool { return keyStats(t, p, k).Waiting == 1 })
		start := time.Now()
		e.Complete()
		if err := <-got; err != nil {
			t.Fatalf("waiter not served after the only unit came back: %v", err)
		}
		if d := time.Since(start); d > time.Second {
			t.Fatalf("waiter served %v after the unit came back", d)
		}
	})
}

func keyStats(t *testing.T, p *Pool, k Key) KeyStats {
	t.Helper()
	snap, err := p.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	for _, ks := range snap.Keys {
		if ks.Key == k {
			return ks
		}
	}
	return KeyStats{Key: k}
}

// A pending bit whose ticket is gone (its reserver died between setting the
// bit and the owner reading its ticket) is still dropped by aging.
func TestReconcileDropsOrphanedPendingBit(t *testing.T) {
	backings(t, func(t *testing.T, p *Pool) {
		k := Key{41, 41}
		id, err := p.Register(k, 1)
		if err != nil {
			t.Fatal(err)
		}
		s := p.seg
		word := s.u64(s.slotOff(p.Lane(), id.Slot()) + slWord)
		atomic.OrUint64(word, 1<<3) // the bit, and no ticket
		if _, err := p.Reserve(id); !errors.Is(err, ErrBusy) {
			t.Fatalf("reserve with the orphan: %v, want ErrBusy", err)
		}
		waitFor(t, func() bool {
			p.Reconcile()
			return wPend(atomic.LoadUint64(word)) == 0
		})
		l, err := p.Reserve(id)
		if err != nil {
			t.Fatalf("reserve after aging: %v", err)
		}
		if _, err := p.Accept(l); err != nil {
			t.Fatal(err)
		}
	})
}

// Reconcile racing with reservers that die right after reserving never
// leaves a bit behind without its ticket.
func TestReconcileWithDyingReservers(t *testing.T) {
	spec := PoolSpec{Lanes: 3, Keys: 4, ResourcesPerLane: 8}
	// The owner never ages a reservation out: only its reserver's death
	// may clear it.
	opts := noAging
	ps := openSharedOpts(t, spec, 1, opts)
	owner := ps[0]
	k := Key{42, 42}
	id, err := owner.Register(k, 1)
	if err != nil {
		t.Fatal(err)
	}
	word := owner.seg.u64(owner.seg.slotOff(owner.Lane(), id.Slot()) + slWord)
	rounds := 300
	if testing.Short() {
		rounds = 50
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
				owner.Reconcile()
			}
		}
	})
	defer func() { close(stop); wg.Wait() }()
	for round := range rounds {
		r, err := Open(owner.Spec(), opts)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := r.Reserve(id); err != nil {
			t.Fatalf("round %d: reserve: %v", round, err)
		}
		simulateDeath(r)
		deadline := time.Now().Add(5 * time.Second)
		for wPend(atomic.LoadUint64(word)) != 0 {
			if time.Now().After(deadline) {
				t.Fatalf("round %d: a dead reserver's bit stayed set (word %#x)", round, atomic.LoadUint64(word))
			}
			time.Sleep(100 * time.Microsecond)
		}
	}
}

// A waiter mask that lost this lane's bit lets the key entry be recycled
// under local waiters; watching the key again must neither spin nor hang.
func TestWatchSurvivesCorruptWaiterMask(t *testing.T) {
	backings(t, func(t *testing.T, p *Pool) {
		k := Key{51, 51}
		r1, err := p.Watch(k)
		if err != nil {
			t.Fatal(err)
		}
		ref := mustRef(t, p, k)
		s := p.seg
		atomic.StoreUint64(s.u64(s.maskOff(ref.idx, p.lane)), 0) // the corrupt bit
		s.lockStructure()
		p.collectKeys()
		s.unlockStructure()
		done := make(chan error, 1)
		go func() {
			r2, err := p.Watch(k)
			if err == nil {
				r2.Close()
			}
			done <- err
		}()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatal("Watch did not return after the key entry was recycled under its waiters")
		}
		select {
		case <-r1.Ready(): // the stranded waiter was told to re-check
		case <-time.After(5 * time.Second):
			t.Fatal("the waiter on the recycled entry was never woken")
		}
		r1.Close()
	})
}

// A dropped Execution or CreationPermit gives its unit back once collected,
// and is counted.
func TestDroppedGuardsAreReturned(t *testing.T) {
	backings(t, func(t *testing.T, p *Pool) {
		k := Key{61, 61}
		lim := Limits{MaxResources: 2}
		func() {
			cp, err := p.ClaimCreate(k, lim)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := cp.RegisterAndAccept(1); err != nil { // dropped Execution
				t.Fatal(err)
			}
			if _, err := p.ClaimCreate(k, lim); err != nil { // dropped permit
				t.Fatal(err)
			}
		}()
		if _, err := p.ClaimCreate(k, lim); !errors.Is(err, ErrBudget) {
			t.Fatalf("claim with both guards live: %v, want ErrBudget", err)
		}
		deadline := time.Now().Add(10 * time.Second)
		for {
			runtime.GC()
			ks := keyStats(t, p, k)
			if ks.InUse == 0 && ks.Creating == 0 && p.LeakedGuards() == 2 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("after GC: %+v, %d leaked guards counted; want nothing in use or creating, 2 counted", ks, p.LeakedGuards())
			}
			time.Sleep(time.Millisecond)
		}
		cp, err := p.ClaimCreate(k, lim)
		if err != nil {
			t.Fatalf("claim after the dropped permit was returned: %v", err)
		}
		cp.Close()
	})
}
