package orbitpool

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// randomPolicy waits, refuses, reuses or creates at random.
type randomPolicy struct{ rng *rand.Rand }

func (p randomPolicy) Decide(v *View) Decision {
	switch p.rng.IntN(6) {
	case 0:
		return Decision{Action: ActionWait, Reason: ReasonBusy}
	case 1:
		return Decision{Action: ActionRefuse, Reason: ReasonPolicy}
	case 2:
		if v.CanCreate() {
			return Decision{Action: ActionCreate}
		}
	}
	return LocalFirst{}.Decide(v)
}

// TestAdvAcquireChurnSettles: two lanes, three keys under a tight budget;
// goroutines Acquire with random policies (some wait then refuse) and
// contexts that end at random moments, create and register or abandon,
// unregister, present or drop leases. A monitor checks in-use + pending <=
// capacity on every live slot throughout. Afterwards (reservations aged)
// nothing is in use, pending, creating or waiting, each key's total equals
// its live slots, and one more Acquire per key is served at once.
func TestAdvAcquireChurnSettles(t *testing.T) {
	spec := PoolSpec{Lanes: 2, Keys: 8, ResourcesPerLane: 16}
	t.Run("shared", func(t *testing.T) {
		ps := openShared(t, spec, 2)
		advChurn(t, ps)
	})
	t.Run("memory", func(t *testing.T) {
		advChurn(t, []*Pool{openMem(t, spec)})
	})
}

func advChurn(t *testing.T, ps []*Pool) {
	keys := []Key{{0x5e, 0}, {0x5e, 1}, {0x5e, 2}}
	lim := Limits{MaxResources: 3, MaxCreating: 1}
	d := 2 * time.Second
	if testing.Short() {
		d = 500 * time.Millisecond
	}
	byLane := map[int]*Pool{}
	for _, p := range ps {
		byLane[p.Lane()] = p
	}
	var mu sync.Mutex
	live := map[ResourceID]*Pool{}
	stop := make(chan struct{})
	var violation atomic.Value
	var wg sync.WaitGroup
	var ops, refused, waited atomic.Int64
	for g := range 10 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), uint64(g)))
			for {
				select {
				case <-stop:
					return
				default:
				}
				p := ps[rng.IntN(len(ps))]
				k := keys[rng.IntN(len(keys))]
				var pol Policy
				switch rng.IntN(5) {
				case 0:
					pol = LocalOnly{}
				case 1:
					pol = randomPolicy{rng}
				case 2:
					pol = CreateBeforeRemote{}
				default:
					pol = LocalFirst{}
				}
				ctx, cancel := context.WithTimeout(context.Background(), time.Duration(rng.IntN(3000))*time.Microsecond)
				if rng.IntN(10) == 0 {
					cancel()
				}
				plan, err := p.Acquire(ctx, k, pol, lim)
				cancel()
				ops.Add(1)
				if err != nil {
					if _, ok := err.(*WaitError); ok {
						waited.Add(1)
					} else {
						refused.Add(1)
					}
					continue
				}
				switch plan.Kind {
				case PlanReuseLocal:
					if rng.IntN(2) == 0 {
						time.Sleep(time.Duration(rng.IntN(300)) * time.Microsecond)
					}
					plan.Execution.Complete()
					if rng.IntN(4) == 0 {
						plan.Execution.Complete()
					}
				case PlanReuseRemote:
					if rng.IntN(8) == 0 {
						continue // never presented: ages
					}
					owner := byLane[plan.Lease.ID.Lane()]
					e, err := owner.Accept(plan.Lease)
					if err == nil {
						if _, err := owner.Accept(plan.Lease); err == nil {
							violation.Store(fmt.Sprintf("lease %+v accepted twice", plan.Lease))
						}
						e.Complete()
					}
				case PlanCreate:
					switch rng.IntN(3) {
					case 0:
						plan.Permit.Close()
					default:
						id, err := plan.Permit.Register(1 + rng.IntN(2))
						if err == nil {
							mu.Lock()
							live[id] = p
							mu.Unlock()
						}
					}
				}
			}
		})
	}
	wg.Go(func() { // unregister at random
		rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 99))
		for {
			select {
			case <-stop:
				return
			default:
			}
			time.Sleep(time.Duration(rng.IntN(2000)) * time.Microsecond)
			mu.Lock()
			for id, p := range live {
				if rng.IntN(3) == 0 {
					p.Unregister(id)
					delete(live, id)
				}
			}
			mu.Unlock()
		}
	})
	wg.Go(func() { // monitor
		s := ps[0].seg
		for {
			select {
			case <-stop:
				return
			default:
			}
			for l := range s.l.nlanes {
				for i := range s.l.perLane {
					off := s.slotOff(l, i)
					w := atomic.LoadUint64(s.u64(off + slWord))
					c := int(atomic.LoadUint32(s.u32(off + slCapacity)))
					w2 := atomic.LoadUint64(s.u64(off + slWord))
					if wState(w) == StateLive && wGen(w) == wGen(w2) && wUse(w)+wPendN(w) > c {
						violation.Store(fmt.Sprintf("slot %d/%d: in use %d + pending %d > capacity %d", l, i, wUse(w), wPendN(w), c))
					}
				}
			}
		}
	})
	time.Sleep(d)
	close(stop)
	wg.Wait()
	if v := violation.Load(); v != nil {
		t.Fatal(v)
	}
	// Let reservations age and wake-ups drain: a reconcile sees what is
	// pending now, and one past the timeout after it drops it, however
	// long the dispatchers were kept off the CPU.
	for _, p := range ps {
		p.Reconcile()
	}
	time.Sleep(testOpts.ReservationTimeout + 50*time.Millisecond)
	for _, p := range ps {
		p.Reconcile()
	}
	s := ps[0].seg
	snap, _ := ps[0].Snapshot()
	for _, k := range keys {
		ks := mpKS(snap, k)
		ref := mustRef(t, ps[0], k)
		slots := 0
		for l := range s.l.nlanes {
			for i := range s.l.perLane {
				off := s.slotOff(l, i)
				w := atomic.LoadUint64(s.u64(off + slWord))
				if kk, kg, ok := ps[0].slotKey(off); ok && kk == ref.idx && kg == ref.gen && (wState(w) == StateLive || wState(w) == StateCreating) {
					slots++
				}
			}
		}
		c := atomic.LoadUint64(s.u64(s.keyOff(ref.idx) + kfCtl))
		if ks.InUse != 0 || ks.Pending != 0 || ks.Creating != 0 || ks.Waiting != 0 || kTotal(c) != slots {
			t.Errorf("key %v settled as %+v; counter total %d, %d slots hold it", k, ks, kTotal(c), slots)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		plan, err := ps[0].Acquire(ctx, k, LocalFirst{}, lim)
		cancel()
		if err != nil {
			t.Errorf("key %v: an Acquire after everything settled: %v (%+v)", k, err, ks)
		} else {
			switch plan.Kind {
			case PlanReuseLocal:
				plan.Execution.Complete()
			case PlanReuseRemote:
				if e, err := byLane[plan.Lease.ID.Lane()].Accept(plan.Lease); err == nil {
					e.Complete()
				}
			case PlanCreate:
				plan.Permit.Close()
			}
		}
	}
	t.Logf("%d acquisitions, %d waits timed out, %d refused/failed", ops.Load(), waited.Load(), refused.Load())
}

// TestAdvCloseRacingEverything: a pool is closed while its goroutines
// acquire (waiting, creating, reusing local and remote), register, register
// and accept, unregister, close permits and watch, on keys a surviving lane
// also holds. After each Close: the closed lane holds nothing, every key's
// counters equal what the survivor's slots hold, the survivor's resources
// have nothing in use or pending once leases age, and nobody waits.
func TestAdvCloseRacingEverything(t *testing.T) {
	spec := PoolSpec{Lanes: 2, Keys: 16, ResourcesPerLane: 32}
	ps := openShared(t, spec, 1)
	surv := ps[0]
	s := surv.seg
	keys := []Key{{0xc1, 0}, {0xc1, 1}, {0xc1, 2}}
	survIDs := map[Key]ResourceID{}
	for _, k := range keys {
		id, err := surv.Register(k, 2)
		if err != nil {
			t.Fatal(err)
		}
		survIDs[k] = id
	}
	rounds := 300
	if testing.Short() {
		rounds = 50
	}
	for round := range rounds {
		p, err := Open(surv.Spec(), testOpts)
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		start := make(chan struct{})
		for g := range 8 {
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(round), uint64(g)))
				<-start
				for i := 0; ; i++ {
					k := keys[rng.IntN(len(keys))]
					var err error
					switch rng.IntN(5) {
					case 0, 1:
						ctx, cancel := context.WithTimeout(context.Background(), time.Duration(rng.IntN(2000))*time.Microsecond)
						var plan Plan
						plan, err = p.Acquire(ctx, k, LocalFirst{}, Limits{MaxResources: 3})
						cancel()
						if err == nil {
							switch plan.Kind {
							case PlanReuseLocal:
								plan.Execution.Complete()
							case PlanReuseRemote:
								if e, err := surv.Accept(plan.Lease); err == nil {
									e.Complete()
								}
							case PlanCreate:
								if rng.IntN(2) == 0 {
									plan.Permit.Close()
								} else if e, err := plan.Permit.RegisterAndAccept(1); err == nil {
									e.Complete()
								}
							}
						}
					case 2:
						var id ResourceID
						if id, err = p.Register(k, 1); err == nil && rng.IntN(2) == 0 {
							err = p.Unregister(id)
						}
					case 3:
						var r *Readiness
						if r, err = p.Watch(k); err == nil {
							r.Close()
						}
					default:
						var cp *CreationPermit
						if cp, err = p.ClaimCreate(k, Limits{MaxResources: 4}); err == nil {
							err = cp.Close()
						}
					}
					if errors.Is(err, ErrClosed) {
						return
					}
				}
			})
		}
		close(start)
		time.Sleep(time.Duration(500+rand.IntN(3000)) * time.Microsecond)
		p.Close()
		wg.Wait()
		for i := range spec.ResourcesPerLane {
			if w := atomic.LoadUint64(s.u64(s.slotOff(p.Lane(), i) + slWord)); wState(w) != StateFree {
				t.Fatalf("round %d: slot %d of the closed lane is %v", round, i, wState(w))
			}
		}
		for _, k := range keys {
			ref := mustRef(t, surv, k)
			c := atomic.LoadUint64(s.u64(s.keyOff(ref.idx) + kfCtl))
			if kTotal(c) != 1 || kCreating(c) != 0 {
				t.Fatalf("round %d: key %v counts %d resources (%d creating); the survivor holds 1", round, k, kTotal(c), kCreating(c))
			}
		}
		snap, ok := mpWaitSnap(surv, 2*time.Second, func(sn Snapshot) bool {
			for _, k := range keys {
				if ks := mpKS(sn, k); ks.InUse != 0 || ks.Pending != 0 || ks.Waiting != 0 {
					return false
				}
			}
			return true
		})
		if !ok {
			t.Fatalf("round %d: survivor's keys did not settle: %+v", round, snap.Keys)
		}
	}
}

// TestAdvNoLostWakeups: three keys with one resource of capacity 1 each and
// no budget to create more; goroutines in two lanes Acquire with long
// deadlines (LocalFirst: local use or a remote lease presented to the owner),
// hold briefly and complete; the owner also unregisters and re-registers the
// resources now and then. Each hold is at most ~200µs, so a waiter that
// times out after 2s missed a wake-up.
func TestAdvNoLostWakeups(t *testing.T) {
	spec := PoolSpec{Lanes: 2, Keys: 8, ResourcesPerLane: 8}
	ps := openShared(t, spec, 2)
	owner := ps[0]
	keys := []Key{{0x1a, 0}, {0x1a, 1}, {0x1a, 2}}
	var idMu sync.Mutex
	ids := map[Key]ResourceID{}
	for _, k := range keys {
		id, err := owner.Register(k, 1)
		if err != nil {
			t.Fatal(err)
		}
		ids[k] = id
	}
	lim := Limits{MaxResources: 1}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var served, lost atomic.Int64
	var firstLost atomic.Value
	for g := range 12 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), uint64(g)))
			p := ps[g%2]
			for {
				select {
				case <-stop:
					return
				default:
				}
				k := keys[rng.IntN(len(keys))]
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				plan, err := p.Acquire(ctx, k, LocalFirst{}, lim)
				cancel()
				if err != nil {
					lost.Add(1)
					firstLost.CompareAndSwap(nil, fmt.Sprintf("%v: %v", k, err))
					continue
				}
				hold := time.Duration(rng.IntN(200)) * time.Microsecond
				switch plan.Kind {
				case PlanReuseLocal:
					time.Sleep(hold)
					plan.Execution.Complete()
				case PlanReuseRemote:
					if e, err := owner.Accept(plan.Lease); err == nil {
						time.Sleep(hold)
						e.Complete()
					}
				case PlanCreate: // the resource was unregistered: recreate it
					id, err := plan.Permit.Register(1)
					if err == nil && p == owner {
						idMu.Lock()
						ids[k] = id
						idMu.Unlock()
					} else if err == nil {
						// a resource in the other lane: remove it again soon
						time.Sleep(hold)
						p.Unregister(id)
					}
				}
				served.Add(1)
			}
		})
	}
	wg.Go(func() { // the owner replaces a resource now and then
		rng := rand.New(rand.NewPCG(5, 5))
		for {
			select {
			case <-stop:
				return
			case <-time.After(time.Duration(rng.IntN(5000)) * time.Microsecond):
			}
			k := keys[rng.IntN(len(keys))]
			idMu.Lock()
			id := ids[k]
			idMu.Unlock()
			if owner.Unregister(id) == nil {
				// an Acquire's PlanCreate will register it again
			}
		}
	})
	time.Sleep(4 * time.Second)
	close(stop)
	wg.Wait()
	if n := lost.Load(); n > 0 {
		t.Fatalf("%d of %d acquisitions waited 2s for a unit that is never held longer than ~200µs; first: %v", n, served.Load()+n, firstLost.Load())
	}
	t.Logf("%d acquisitions served, none lost", served.Load())
}
