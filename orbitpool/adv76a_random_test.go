package orbitpool

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// adv76a randomized fleet: three children churn a small table (4 key
// entries for 6 keys, so entries are collected and reused across keys, and 3
// slots a lane) with random Acquire (local uses, remote reservations that
// are withdrawn, withdrawn twice, or left to age out), creation, Unregister,
// direct Reserve/Withdraw of the parent's resources, WatchRoom/Rearm/Close,
// and Close/reopen of the whole pool with watches armed. One child is
// SIGKILLed at a random instant. Meanwhile the parent checks every live slot
// of the segment: its users and pending reservations never exceed its
// capacity (no capacity is ever lowered, so not even transiently). Children
// check in-process that their own resources never have more local
// executions than capacity, and that every watch is woken by its pool's
// Close. At the end the parent reconciles and requires that every unit came
// back: its resources have no user or reservation, the key table counts
// exactly the live slots, and nothing is pending, in use, creating or
// waiting.

var adv76aKeys = []Key{{0xa76a, 1}, {0xa76a, 2}, {0xa76a, 3}, {0xa76a, 4}, {0xa76a, 5}, {0xa76a, 6}}

var adv76aSpec = PoolSpec{Lanes: 8, Keys: 4, ResourcesPerLane: 3}

func init() { mpMoreRoles["adv76a-rand"] = adv76aRoleRand }

func adv76aBenign(err error) bool {
	if err == nil {
		return true
	}
	var we *WaitError
	var re *RefusedError
	return errors.Is(err, ErrBusy) || errors.Is(err, ErrFull) || errors.Is(err, ErrBudget) ||
		errors.Is(err, ErrClosed) || errors.Is(err, ErrStale) || errors.Is(err, context.DeadlineExceeded) ||
		errors.As(err, &we) || errors.As(err, &re) || errors.Is(err, errStaleView)
}

func adv76aRoleRand(c *mpChildCtx) error {
	rng := rand.New(rand.NewPCG(c.args.Seed, 76))
	var rmu sync.Mutex
	rnd := func(n int) int { rmu.Lock(); defer rmu.Unlock(); return rng.IntN(n) }
	leave := make(chan struct{})
	go func() { c.untilParentLeaves(); close(leave) }()
	var violations atomic.Int32
	viol := func(format string, args ...any) {
		if violations.Add(1) <= 20 {
			c.fail(format, args...)
		}
	}
	var nLocal, nRemote, nCreate, nWoken atomic.Int64
	c.send(mpMsg{Type: "ready"})
	for epoch := 0; ; epoch++ {
		select {
		case <-leave:
			c.send(mpMsg{Type: "stats", Nanos: []int64{nLocal.Load(), nRemote.Load(), nCreate.Load(), nWoken.Load(), int64(epoch)}})
			return nil
		default:
		}
		p, err := c.open()
		if err != nil {
			if errors.Is(err, ErrFull) {
				time.Sleep(5 * time.Millisecond)
				continue
			}
			return err
		}
		var (
			mu      sync.Mutex
			own     = map[ResourceID]int{} // capacity
			inUse   = map[ResourceID]*atomic.Int32{}
			watches []*RoomWatch
		)
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for w := 0; w < c.args.Workers; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					k := adv76aKeys[rnd(len(adv76aKeys))]
					switch op := rnd(10); {
					case op < 5:
						ctx, cancel := context.WithTimeout(context.Background(), time.Duration(5+rnd(25))*time.Millisecond)
						plan, err := p.Acquire(ctx, k, nil, Limits{MaxResources: 2, MaxCreating: 1})
						cancel()
						if err != nil {
							if !adv76aBenign(err) {
								viol("Acquire %v: %v", k, err)
							}
							continue
						}
						switch plan.Kind {
						case PlanReuseLocal:
							nLocal.Add(1)
							id := plan.Execution.ID()
							mu.Lock()
							cp, ok := own[id]
							n := inUse[id]
							mu.Unlock()
							if ok && n != nil {
								if v := n.Add(1); int(v) > cp {
									viol("resource %v: %d local executions, capacity %d", id, v, cp)
								}
								time.Sleep(time.Duration(rnd(2000)) * time.Microsecond)
								n.Add(-1)
							}
							plan.Execution.Complete()
						case PlanReuseRemote:
							nRemote.Add(1)
							switch rnd(4) {
							case 0:
								p.Withdraw(plan.Lease)
							case 1:
								time.Sleep(time.Duration(rnd(2000)) * time.Microsecond)
								p.Withdraw(plan.Lease)
								p.Withdraw(plan.Lease) // twice is harmless
							case 2:
								// left to age out
							case 3:
								go p.Withdraw(plan.Lease)
								p.Withdraw(plan.Lease)
							}
						case PlanCreate:
							if rnd(4) == 0 {
								plan.Permit.Close()
								continue
							}
							cp := 1 + rnd(2)
							id, err := plan.Permit.Register(cp)
							if err != nil {
								if !adv76aBenign(err) {
									viol("Register: %v", err)
								}
								continue
							}
							nCreate.Add(1)
							mu.Lock()
							own[id] = cp
							inUse[id] = new(atomic.Int32)
							mu.Unlock()
						}
					case op == 5 && len(c.args.IDs) > 0:
						id := c.args.IDs[rnd(len(c.args.IDs))]
						l, err := p.Reserve(id)
						if err != nil {
							if !adv76aBenign(err) {
								viol("Reserve: %v", err)
							}
							continue
						}
						if rnd(3) > 0 {
							time.Sleep(time.Duration(rnd(1000)) * time.Microsecond)
							p.Withdraw(l)
						}
					case op == 6:
						mu.Lock()
						var victim ResourceID
						found := false
						for id := range own {
							victim, found = id, true
							break
						}
						if found {
							delete(own, victim)
						}
						mu.Unlock()
						if found {
							if err := p.Unregister(victim); err != nil && !adv76aBenign(err) {
								viol("Unregister: %v", err)
							}
						}
					case op == 7:
						w, err := p.WatchRoom(k)
						if err != nil {
							if !adv76aBenign(err) {
								viol("WatchRoom %v: %v", k, err)
							}
							continue
						}
						for range 1 + rnd(3) {
							select {
							case <-w.Ready():
								nWoken.Add(1)
								w.Rearm()
							case <-time.After(time.Duration(1+rnd(10)) * time.Millisecond):
							case <-stop:
							}
						}
						if rnd(3) == 0 {
							mu.Lock()
							watches = append(watches, w) // left armed for the pool's Close
							mu.Unlock()
						} else {
							w.Close()
						}
					default:
						time.Sleep(time.Duration(rnd(500)) * time.Microsecond)
					}
				}
			}()
		}
		// Close the pool under the workers after a while, with watches armed.
		select {
		case <-time.After(time.Duration(100+rnd(300)) * time.Millisecond):
		case <-leave:
		}
		cerr := p.Close()
		close(stop)
		wg.Wait()
		if cerr != nil {
			viol("Close: %v", cerr)
		}
		mu.Lock()
		for i, w := range watches {
			if !readyWithin(w.Ready(), time.Second) {
				viol("epoch %d: watch %d not woken by its pool's Close", epoch, i)
			}
			if u := w.Rearm(); u != 0 {
				viol("Rearm after Close: %d units", u)
			}
			w.Close()
		}
		mu.Unlock()
		if n := p.watches.n.Load(); n != 0 && len(watches) == 0 {
			// Watches closed by hand after the pool closed must not be counted.
			viol("epoch %d: %d watches counted after all were closed", epoch, n)
		}
	}
}

func TestAdv76aRandomFleet(t *testing.T) {
	for seed := uint64(1); seed <= 2; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { adv76aRandomFleet(t, seed) })
	}
}

func adv76aRandomFleet(t *testing.T, seed uint64) {
	spec := adv76aSpec
	spec.Path = filepath.Join(t.TempDir(), "seg")
	resTimeout := 40 * time.Millisecond
	p, err := Open(spec, Options{ReconcileInterval: 10 * time.Millisecond, ReservationTimeout: resTimeout})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	var ids []ResourceID
	for _, k := range adv76aKeys[:2] {
		id, err := p.Register(k, 2)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	// The monitor: no live slot ever has more users and reservations than
	// its capacity.
	s := p.seg
	var over atomic.Int64
	var overMsg atomic.Pointer[string]
	mstop := make(chan struct{})
	mdone := make(chan struct{})
	go func() {
		defer close(mdone)
		for {
			select {
			case <-mstop:
				return
			default:
			}
			for l := range p.l.nlanes {
				for i := range p.l.perLane {
					off := s.slotOff(l, i)
					w := atomic.LoadUint64(s.u64(off + slWord))
					if wState(w) != StateLive {
						continue
					}
					cp := s.capacity(off)
					if w2 := atomic.LoadUint64(s.u64(off + slWord)); wGen(w2) != wGen(w) {
						continue
					}
					if n := wUse(w) + wPendN(w); n > cp {
						if over.Add(1) == 1 {
							m := fmt.Sprintf("lane %d slot %d gen %d: %d users + %d reservations over capacity %d", l, i, wGen(w), wUse(w), wPendN(w), cp)
							overMsg.Store(&m)
						}
					}
				}
			}
			time.Sleep(200 * time.Microsecond)
		}
	}()
	defer func() { close(mstop); <-mdone }()

	rng := rand.New(rand.NewPCG(seed, 7676))
	var cs []*mpChild
	for i := range 3 {
		cs = append(cs, mpStart(t, "adv76a-rand", mpArgs{Spec: spec, Seed: seed*10 + uint64(i), Workers: 2, IDs: ids,
			Reconcile: 10 * time.Millisecond, ResTimeout: resTimeout, Lifetime: 30 * time.Second}))
	}
	for _, c := range cs {
		c.expect("ready", 10*time.Second)
	}
	run := time.Duration(mpScale(2500, 1500)) * time.Millisecond
	killAt := time.Duration(300+rng.IntN(int(run/time.Millisecond)-400)) * time.Millisecond
	time.Sleep(killAt)
	victim := cs[rng.IntN(len(cs))]
	victim.kill()
	for m := range victim.msgs { // closed once the victim is gone
		if m.Type == "error" {
			t.Errorf("killed child, before it died: %s", m.Err)
		}
	}
	time.Sleep(run - killAt)
	// A loaded machine may run the survivors too slowly to reuse an entry
	// in that time: let them run on, a bounded while, until one is.
	for end := time.Now().Add(10 * time.Second); adv76aHighestKeyGen(p) < 2 && time.Now().Before(end); {
		time.Sleep(50 * time.Millisecond)
	}
	var act [5]int64
	for _, c := range cs {
		if c != victim {
			c.stdin.Close()
			m := c.expect("stats", 10*time.Second)
			for i := range act {
				act[i] += m.Nanos[i]
			}
			c.finish(10 * time.Second)
		}
	}
	t.Logf("survivors: %d local uses, %d remote reservations, %d creations, %d watch wake-ups, %d pool lives", act[0], act[1], act[2], act[3], act[4])
	if act[0] == 0 || act[1] == 0 || act[2] == 0 || act[3] == 0 || act[4] < 2 {
		t.Errorf("the run did not exercise every path: %v", act)
	}
	if maxGen := adv76aHighestKeyGen(p); maxGen < 2 {
		t.Errorf("no key entry was reused for another key (highest generation %d)", maxGen)
	}
	if n := over.Load(); n > 0 {
		t.Errorf("capacity exceeded %d times; first: %s", n, *overMsg.Load())
	}

	// Everything comes back: reclaim the dead lane, age its reservations.
	deadline := time.Now().Add(5 * time.Second)
	var last string
	for {
		if err := p.Reconcile(); err != nil {
			t.Fatalf("Reconcile: %v", err)
		}
		last = adv76aSettled(p, ids)
		if last == "" || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if last != "" {
		t.Fatalf("5s after the fleet left, not every unit came back: %s", last)
	}
	// Every unit of the parent's resources can be had again.
	for _, id := range ids {
		for range 2 {
			if _, err := p.Reserve(id); err != nil {
				t.Errorf("reserve %v after the fleet left: %v", id, err)
			}
		}
		if _, err := p.Reserve(id); !errors.Is(err, ErrBusy) {
			t.Errorf("third reservation of %v (capacity 2): %v, want ErrBusy", id, err)
		}
	}
}

// adv76aHighestKeyGen is the highest generation of p's key entries: 2 or
// more once an entry has gone to another key.
func adv76aHighestKeyGen(p *Pool) uint32 {
	s := p.seg
	maxGen := uint32(0)
	for k := range p.l.nkeys {
		maxGen = max(maxGen, kGen(atomic.LoadUint64(s.u64(s.keyOff(k)+kfCtl))))
	}
	return maxGen
}

// adv76aSettled says what is not yet back, "" when all is.
func adv76aSettled(p *Pool, ids []ResourceID) string {
	s := p.seg
	for _, id := range ids {
		if n, err := p.Users(id); err != nil || n != 0 {
			return fmt.Sprintf("resource %v: %d users/reservations (%v)", id, n, err)
		}
		off := s.slotOff(id.Lane(), id.Slot())
		for b := range PendingReservations {
			if tk := atomic.LoadUint64(s.u64(off + slTickets + 8*b)); tk != 0 {
				return fmt.Sprintf("resource %v: ticket %d is %#x (claim: %v)", id, b, tk, isClaim(tk))
			}
		}
	}
	live := make([]int, p.l.nkeys)
	for l := range p.l.nlanes {
		for i := range p.l.perLane {
			off := s.slotOff(l, i)
			w := atomic.LoadUint64(s.u64(off + slWord))
			if wState(w) == StateFree {
				continue
			}
			if l != p.lane {
				return fmt.Sprintf("lane %d slot %d still %v after its process left", l, i, wState(w))
			}
			if k, _, ok := p.slotKey(off); ok {
				live[k]++
			}
		}
	}
	for k := range p.l.nkeys {
		c := atomic.LoadUint64(s.u64(s.keyOff(k) + kfCtl))
		if kState(c) != keyLive {
			continue
		}
		if kTotal(c) != live[k] || kCreating(c) != 0 {
			return fmt.Sprintf("key entry %d counts %d resources (%d creating), %d slots hold it", k, kTotal(c), kCreating(c), live[k])
		}
		if p.awaited(k) {
			return fmt.Sprintf("key entry %d still has a waiter or watch bit with every other process gone", k)
		}
	}
	snap, err := p.Snapshot()
	if err != nil {
		return err.Error()
	}
	for _, ks := range snap.Keys {
		if ks.InUse != 0 || ks.Pending != 0 || ks.Creating != 0 || ks.Waiting != 0 {
			return fmt.Sprintf("key %v: %+v", ks.Key, ks)
		}
	}
	if n := len(snap.Lanes); n != 1 {
		return fmt.Sprintf("%d lanes live, want the parent's only", n)
	}
	return ""
}
