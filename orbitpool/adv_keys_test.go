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

// reuseOnly reuses like LocalFirst and never creates or waits.
type reuseOnly struct{}

func (reuseOnly) Decide(v *View) Decision {
	d := LocalFirst{}.Decide(v)
	if d.Action != ActionReuse {
		return Decision{Action: ActionRefuse, Reason: ReasonPolicy}
	}
	return d
}

// TestAdvKeyEntryRecyclingNeverCrossesKeys: a key table of 4 entries and 40
// keys, so entries are collected and given to other keys all the time, while
// one goroutine registers and unregisters resources across those keys (the
// LIFO free list hands slots from key to key) and others acquire, list and
// reserve random keys from both lanes. Every resource handed out or listed
// for a key must have been registered under that key.
func TestAdvKeyEntryRecyclingNeverCrossesKeys(t *testing.T) {
	spec := PoolSpec{Lanes: 2, Keys: 4, ResourcesPerLane: 8}
	ps := openShared(t, spec, 2)
	owner, other := ps[0], ps[1]
	keyOf := sync.Map{} // ResourceID -> Key
	keyFor := func(i int) Key { return Key{0x4ec, uint64(i)} }
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var bad atomic.Value
	var seen, regs atomic.Int64
	check := func(id ResourceID, k Key, how string) {
		seen.Add(1)
		v, ok := keyOf.Load(id)
		if !ok || v.(Key) != k {
			bad.Store(fmt.Sprintf("%s for key %v yielded %v, registered under %v (known %v)", how, k, id, v, ok))
		}
	}
	wg.Go(func() {
		rng := rand.New(rand.NewPCG(1, 2))
		var held []ResourceID
		for {
			select {
			case <-stop:
				for _, id := range held {
					owner.Unregister(id)
				}
				return
			default:
			}
			if len(held) >= 2 || (len(held) > 0 && rng.IntN(2) == 0) {
				i := rng.IntN(len(held))
				owner.Unregister(held[i])
				held = append(held[:i], held[i+1:]...)
				continue
			}
			k := keyFor(rng.IntN(40))
			cp, err := owner.ClaimCreate(k, Limits{})
			if err != nil {
				continue // table full of live keys: fine
			}
			// Record the key before the resource is visible.
			id := makeID(owner.Lane(), cp.slot, cp.gen)
			keyOf.Store(id, k)
			if _, err := cp.Register(2); err != nil {
				t.Errorf("register: %v", err)
				return
			}
			regs.Add(1)
			held = append(held, id)
		}
	})
	for g := range 3 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(3, uint64(g)))
			var cs []Candidate
			for {
				select {
				case <-stop:
					return
				default:
				}
				k := keyFor(rng.IntN(40))
				switch g {
				case 0:
					ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
					plan, err := owner.Acquire(ctx, k, reuseOnly{}, Limits{})
					cancel()
					if err == nil {
						check(plan.Execution.ID(), k, "local Acquire")
						plan.Execution.Complete()
					}
				case 1:
					ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
					plan, err := other.Acquire(ctx, k, reuseOnly{}, Limits{})
					cancel()
					if err == nil {
						check(plan.Lease.ID, k, "remote Acquire")
						if e, err := owner.Accept(plan.Lease); err == nil {
							check(e.ID(), k, "Accept")
							e.Complete()
						}
					}
				default:
					cs, _ = other.Candidates(k, cs[:0])
					for _, c := range cs {
						check(c.ID, k, "Candidates")
						if l, err := other.Reserve(c.ID); err == nil {
							if e, err := owner.Accept(l); err == nil {
								check(e.ID(), k, "Reserve+Accept")
								e.Complete()
							}
						}
					}
				}
			}
		})
	}
	time.Sleep(2 * time.Second)
	close(stop)
	wg.Wait()
	if v := bad.Load(); v != nil {
		t.Fatal(v)
	}
	if seen.Load() == 0 {
		t.Fatal("nothing was ever handed out")
	}
	maxGen := uint32(0)
	for k := range spec.Keys {
		maxGen = max(maxGen, kGen(atomic.LoadUint64(owner.seg.u64(owner.seg.keyOff(k)+kfCtl))))
	}
	t.Logf("%d registrations, %d resources handed out or listed, all of their key; key entries reused up to %d times", regs.Load(), seen.Load(), maxGen)
}

// TestAdvWatchStaleRefIsNotCorruption: with a full key table, an entry can be
// collected and given to another key between Watch's lookup and its
// registration, with no corruption anywhere. Watch then meets local waiters
// of the entry's new life; it must not report ErrCorrupt (a false alarm in
// the logs) nor wake those waiters for nothing.
func TestAdvWatchStaleRefIsNotCorruption(t *testing.T) {
	var corrupt atomic.Int64
	var first atomic.Value
	opts := testOpts
	opts.OnError = func(err error) {
		if errors.Is(err, ErrCorrupt) {
			corrupt.Add(1)
			first.CompareAndSwap(nil, err.Error())
		}
	}
	p, err := Open(PoolSpec{Lanes: 1, Keys: 2, ResourcesPerLane: 4}, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var watches atomic.Int64
	for g := range 4 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(7, uint64(g)))
			for {
				select {
				case <-stop:
					return
				default:
				}
				r, err := p.Watch(Key{0x57, uint64(rng.IntN(6))})
				if err == nil {
					watches.Add(1)
					time.Sleep(time.Duration(rng.IntN(50)) * time.Microsecond)
					r.Close()
				}
			}
		})
	}
	time.Sleep(2 * time.Second)
	close(stop)
	wg.Wait()
	if n := corrupt.Load(); n > 0 {
		t.Fatalf("%d ErrCorrupt reports in %d watches of an uncorrupted table, first: %v", n, watches.Load(), first.Load())
	}
	t.Logf("%d watches, no false corruption report", watches.Load())
}

// TestAdvWatchRacingCollectionIsNotStranded: collectKeys reads a key's waiter
// mask and then swaps its ctl word; Watch sets its mask bit and then reads
// ctl. A watcher that sets its bit after the collector read the mask, and
// reads ctl before the collector's swap, registers on an entry that is being
// collected and then given to another key: the key's later Register wakes its
// new entry, and the watcher is never told. No corruption is involved: the
// key table is merely full, so naming a key collects idle ones.
func TestAdvWatchRacingCollectionIsNotStranded(t *testing.T) {
	p, err := Open(PoolSpec{Lanes: 1, Keys: 3, ResourcesPerLane: 8}, testOpts)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := range 2 {
		wg.Go(func() { // name keys all the time: every naming collects
			for i := uint64(0); ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				if cp, err := p.ClaimCreate(Key{0x58, uint64(g)<<32 | i}, Limits{}); err == nil {
					cp.Close()
				}
			}
		})
	}
	defer func() { close(stop); wg.Wait() }()
	deadline := time.Now().Add(4 * time.Second)
	n, full := 0, 0
	for i := uint64(0); time.Now().Before(deadline); i++ {
		k := Key{0x59, i}
		r, err := p.Watch(k)
		if err != nil {
			full++
			continue
		}
		n++
		var id ResourceID
		for {
			id, err = p.Register(k, 1) // capacity appears: the watcher must hear of it
			if err == nil {
				break
			}
			if time.Now().After(deadline.Add(2 * time.Second)) {
				t.Fatalf("register: %v", err)
			}
		}
		select {
		case <-r.Ready():
		case <-time.After(time.Second):
			ref, _ := p.lookupKey(k)
			t.Fatalf("watch %d: Register of the watched key did not wake its watcher in 1s (key now at entry %+v); the watch had registered on an entry being collected", n, ref)
		}
		r.Close()
		p.Unregister(id)
	}
	t.Logf("%d watches woken by the Register that followed (%d Watch errors)", n, full)
}
