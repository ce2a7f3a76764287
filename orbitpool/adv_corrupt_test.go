package orbitpool

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// advCorruptTarget picks a word of the segment that a correct process would
// rely on, and says what it is.
func advCorruptTarget(rng *rand.Rand, s *segment) (off int, size int, what string) {
	l := s.l
	switch rng.IntN(13) {
	case 0: // key ctl
		k := rng.IntN(l.nkeys)
		return s.keyOff(k) + kfCtl, 8, fmt.Sprintf("key %d ctl", k)
	case 1: // key waiter mask
		k := rng.IntN(l.nkeys)
		return s.keyOff(k) + kfMasks, 8, fmt.Sprintf("key %d mask", k)
	case 2:
		k := rng.IntN(l.nkeys)
		return s.keyOff(k) + kfTicket, 8, fmt.Sprintf("key %d ticket", k)
	case 10: // a lane's part of a key's queue
		ln, k := rng.IntN(l.nlanes), rng.IntN(l.nkeys)
		return s.queueOff(ln, k), 8, fmt.Sprintf("queue %d/%d", ln, k)
	case 11:
		k := rng.IntN(l.nkeys)
		return s.roomOff(k, 0), 8, fmt.Sprintf("key %d room", k)
	case 12:
		i := rng.IntN(l.nindex)
		return s.indexOff(i), 8, fmt.Sprintf("index entry %d", i)
	case 3: // slot word
		ln, sl := rng.IntN(l.nlanes), rng.IntN(l.perLane)
		return s.slotOff(ln, sl) + slWord, 8, fmt.Sprintf("slot %d/%d word", ln, sl)
	case 4:
		ln, sl := rng.IntN(l.nlanes), rng.IntN(l.perLane)
		return s.slotOff(ln, sl) + slMeta, 8, fmt.Sprintf("slot %d/%d meta", ln, sl)
	case 5:
		ln, sl := rng.IntN(l.nlanes), rng.IntN(l.perLane)
		return s.slotOff(ln, sl) + slNext, 4, fmt.Sprintf("slot %d/%d next", ln, sl)
	case 6:
		ln, sl, b := rng.IntN(l.nlanes), rng.IntN(l.perLane), rng.IntN(PendingReservations)
		return s.slotOff(ln, sl) + slTickets + 8*b, 8, fmt.Sprintf("slot %d/%d ticket %d", ln, sl, b)
	case 7:
		ln, sl := rng.IntN(l.nlanes), rng.IntN(l.perLane)
		return s.slotOff(ln, sl) + slCapacity, 4, fmt.Sprintf("slot %d/%d capacity", ln, sl)
	case 8:
		ln, k := rng.IntN(l.nlanes), rng.IntN(l.nkeys)
		return s.headOff(ln, k), 4, fmt.Sprintf("head %d/%d", ln, k)
	default:
		ln := rng.IntN(l.nlanes)
		return s.laneOff(ln) + lnCtl, 8, fmt.Sprintf("lane %d ctl", ln)
	}
}

func advCorrupt(rng *rand.Rand, s *segment) string {
	off, size, what := advCorruptTarget(rng, s)
	if size == 8 {
		p := s.u64(off)
		old := atomic.LoadUint64(p)
		var v uint64
		if rng.IntN(2) == 0 {
			v = old ^ 1<<rng.IntN(64)
		} else {
			v = rng.Uint64()
		}
		atomic.StoreUint64(p, v)
		return fmt.Sprintf("%s %#x -> %#x", what, old, v)
	}
	p := s.u32(off)
	old := atomic.LoadUint32(p)
	var v uint32
	if rng.IntN(2) == 0 {
		v = old ^ 1<<rng.IntN(32)
	} else {
		v = rng.Uint32()
	}
	atomic.StoreUint32(p, v)
	return fmt.Sprintf("%s %#x -> %#x", what, old, v)
}

// TestAdvCorruptWordsNeverHangOrPanic: random corruption of words every
// operation reads (key ctl, masks, sequences, slot words, meta, next,
// tickets, capacity, list heads, lane ctl) while two lanes hold resources,
// executions, reservations and parked waiters. Every exported operation run
// afterwards must return within a bound and never panic; Close must return.
func TestAdvCorruptWordsNeverHangOrPanic(t *testing.T) {
	spec := PoolSpec{Lanes: 2, Keys: 8, ResourcesPerLane: 8}
	trials := 80
	if testing.Short() {
		trials = 30
	}
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 7))
	keys := []Key{{0xc0, 0}, {0xc0, 1}, {0xc0, 2}, {0xc0, 3}}
	for trial := range trials {
		spec.Path = t.TempDir() + "/seg"
		a, err := Open(spec, testOpts)
		if err != nil {
			t.Fatal(err)
		}
		b, err := Open(spec, testOpts)
		if err != nil {
			t.Fatal(err)
		}
		var held []*Execution
		var ids []ResourceID
		for i, k := range keys[:3] {
			owner := a
			if i == 2 {
				owner = b
			}
			id, err := owner.Register(k, 2)
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, id)
		}
		held = append(held, advAcquire(t, a, keys[0]))
		l, err := b.Reserve(ids[1])
		if err != nil {
			t.Fatal(err)
		}
		// The waiters park because key 3 has a creation in progress.
		cp, err := a.ClaimCreate(keys[3], Limits{MaxResources: 1})
		if err != nil {
			t.Fatal(err)
		}
		// A parked waiter in each lane on key 3.
		parked := make(chan error, 2)
		for _, p := range []*Pool{a, b} {
			go func() {
				defer func() {
					if r := recover(); r != nil {
						parked <- fmt.Errorf("panic: %v\n%s", r, debug.Stack())
					}
				}()
				ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
				defer cancel()
				plan, err := p.Acquire(ctx, keys[3], LocalFirst{}, Limits{MaxResources: 1, MaxCreating: 1})
				if err == nil && plan.Kind == PlanCreate {
					plan.Permit.Close()
				}
				parked <- err
			}()
		}
		time.Sleep(5 * time.Millisecond)
		var what []string
		for range 1 + rng.IntN(4) {
			what = append(what, advCorrupt(rng, a.seg))
		}
		desc := strings.Join(what, "; ")

		type result struct {
			op  string
			err error
		}
		results := make(chan result, 64)
		var wg sync.WaitGroup
		run := func(op string, f func() error) {
			wg.Go(func() {
				defer func() {
					if r := recover(); r != nil {
						results <- result{op, fmt.Errorf("PANIC: %v\n%s", r, debug.Stack())}
					}
				}()
				results <- result{op, f()}
			})
		}
		for i, k := range keys {
			for _, p := range []*Pool{a, b} {
				run(fmt.Sprintf("acquire key %d lane %d", i, p.Lane()), func() error {
					ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
					defer cancel()
					plan, err := p.Acquire(ctx, k, LocalFirst{}, Limits{MaxResources: 3})
					if err == nil {
						switch plan.Kind {
						case PlanReuseLocal:
							plan.Execution.Complete()
						case PlanCreate:
							plan.Permit.Close()
						}
					}
					return nil
				})
				run(fmt.Sprintf("watch key %d lane %d", i, p.Lane()), func() error {
					r, err := p.Watch(k)
					if err == nil {
						r.Close()
					}
					return nil
				})
				run(fmt.Sprintf("claim key %d lane %d", i, p.Lane()), func() error {
					cp, err := p.ClaimCreate(k, Limits{})
					if err == nil {
						cp.Close()
					}
					return nil
				})
				run(fmt.Sprintf("register key %d lane %d", i, p.Lane()), func() error {
					id, err := p.Register(k, 1)
					if err == nil {
						p.Unregister(id)
					}
					return nil
				})
				run(fmt.Sprintf("candidates key %d lane %d", i, p.Lane()), func() error {
					cs, _ := p.Candidates(k, nil)
					for _, c := range cs {
						if l, err := p.Reserve(c.ID); err == nil && c.Local {
							if e, err := p.Accept(l); err == nil {
								e.Complete()
							}
						}
					}
					return nil
				})
			}
		}
		run("accept", func() error {
			if e, err := a.Accept(l); err == nil {
				e.Complete()
			}
			return nil
		})
		run("reconcile", func() error { a.Reconcile(); b.Reconcile(); return nil })
		run("snapshot", func() error { a.Snapshot(); b.Snapshot(); return nil })
		run("unregister", func() error {
			for _, id := range ids {
				a.Unregister(id)
				b.Unregister(id)
			}
			return nil
		})
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatalf("trial %d: operations still running 5s after corrupting: %s", trial, desc)
		}
		close(results)
		for r := range results {
			if r.err != nil {
				t.Fatalf("trial %d: %s after %s: %v", trial, r.op, desc, r.err)
			}
		}
		for range 2 {
			select {
			case err := <-parked:
				if err != nil && strings.HasPrefix(err.Error(), "panic") {
					t.Fatalf("trial %d: parked waiter after %s: %v", trial, desc, err)
				}
			case <-time.After(5 * time.Second):
				t.Fatalf("trial %d: a parked waiter (300ms deadline) never returned after %s", trial, desc)
			}
		}
		for _, e := range held {
			e.Complete()
		}
		cp.Close()
		closed := make(chan struct{})
		go func() { a.Close(); b.Close(); close(closed) }()
		select {
		case <-closed:
		case <-time.After(5 * time.Second):
			t.Fatalf("trial %d: Close did not return after %s", trial, desc)
		}
	}
}

// TestAdvLiveLaneMarkedFreeIsHealed: one flipped word, a live lane's ctl
// state, hides that lane's resources from every sibling and from recount
// (so the key's budget under-counts them) with no error anywhere; the lane's
// process goes on as if nothing happened. Reconcile on either side should
// notice (the kernel says the lane's process is alive) and heal it.
func TestAdvLiveLaneMarkedFreeIsHealed(t *testing.T) {
	ps := openShared(t, PoolSpec{Lanes: 3, Keys: 8, ResourcesPerLane: 8}, 2)
	a, b := ps[0], ps[1]
	k := Key{0xc3, 1}
	if _, err := a.Register(k, 1); err != nil {
		t.Fatal(err)
	}
	s := a.seg
	ctl := s.u64(s.laneOff(a.Lane()) + lnCtl)
	atomic.StoreUint64(ctl, laneCtl(lnGen(atomic.LoadUint64(ctl)), laneFree))
	for range 20 {
		a.Reconcile()
		b.Reconcile()
		time.Sleep(5 * time.Millisecond)
	}
	cs, err := b.Candidates(k, nil)
	if err != nil || len(cs) != 1 {
		t.Errorf("a sibling sees %d candidates (%v) for a key the live lane %d holds a resource of; the lane's ctl word still says %d", len(cs), err, a.Lane(), lnState(atomic.LoadUint64(ctl)))
	}
	// Any reclaim recounts the keys without the hidden lane.
	d, err := Open(a.Spec(), testOpts)
	if err != nil {
		t.Fatal(err)
	}
	simulateDeath(d)
	waitFor(t, func() bool {
		b.Reconcile()
		return lnState(atomic.LoadUint64(s.u64(s.laneOff(d.Lane())+lnCtl))) == laneFree
	})
	if _, err := b.ClaimCreate(k, Limits{MaxResources: 1}); err == nil {
		t.Errorf("a claim within a budget of 1 succeeded while lane %d holds the key's one resource", a.Lane())
	}
}
