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

// TestAdv2HeldNoIdleBudgetWithWaiters: three lanes of one segment churn a
// key's creation budget with everything that makes a delivered grant sit in
// a held word: Acquire with deadlines that end while granted, Readiness
// users that are handed a unit and take it, leave it, or give up at the same
// instant, and lanes that close with waiters and grants and are joined
// again. A monitor samples the shared table: the key's budget must never
// have room for a long stretch while a waiter that is parked for long
// (deadline 3s) sits in the queue. Each Readiness user answers its wake-up
// at once, so a held grant lasts microseconds; a stretch of 750ms is a unit
// nobody will be handed.
func TestAdv2HeldNoIdleBudgetWithWaiters(t *testing.T) {
	for seed := range uint64(2) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { adv2HeldLiveness(t, seed, 3*time.Second) })
	}
}

func adv2HeldLiveness(t *testing.T, seed uint64, dur time.Duration) {
	const lanes, max = 3, 3
	spec := PoolSpec{Path: filepath.Join(t.TempDir(), "seg"), Lanes: lanes + 1, Keys: 8, ResourcesPerLane: 16}
	opts := Options{ReconcileInterval: 20 * time.Millisecond, ReservationTimeout: time.Second}
	k := Key{0xad2e, 0x11e + seed}
	lim := Limits{MaxResources: max}
	var mu sync.Mutex // guards ps against the lane closer
	ps := make([]*Pool, lanes)
	for i := range ps {
		p, err := Open(spec, opts)
		if err != nil {
			t.Fatal(err)
		}
		ps[i] = p
	}
	defer func() {
		mu.Lock()
		for _, p := range ps {
			p.Close()
		}
		mu.Unlock()
	}()
	pool := func(i int) *Pool {
		mu.Lock()
		defer mu.Unlock()
		return ps[i]
	}
	// A separate lane only watches, so that it is never closed.
	mon, err := Open(spec, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer mon.Close()

	var (
		stop      atomic.Bool
		wg        sync.WaitGroup
		acquired  atomic.Int64
		timeouts  atomic.Int64
		longWaits atomic.Int64 // parked waiters with the long deadline
		longFail  atomic.Value
	)
	hold := func(rng *rand.Rand, cp *CreationPermit) {
		acquired.Add(1)
		time.Sleep(time.Duration(rng.IntN(1500)) * time.Microsecond)
		cp.Close()
	}
	for w := range 3 * lanes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(w)))
			lane := w % lanes
			for !stop.Load() {
				p := pool(lane)
				switch op := rng.IntN(10); {
				case op < 5: // Acquire, short or long deadline
					d := time.Duration(rng.IntN(3000)) * time.Microsecond
					long := rng.IntN(3) == 0
					if long {
						d = 3 * time.Second
						longWaits.Add(1)
					}
					ctx, cancel := context.WithTimeout(context.Background(), d)
					plan, err := p.Acquire(ctx, k, LocalOnly{}, lim)
					cancel()
					if long {
						longWaits.Add(-1)
					}
					if err == nil {
						hold(rng, plan.Permit)
					} else {
						timeouts.Add(1)
						if we := (*WaitError)(nil); long && errors.As(err, &we) {
							longFail.CompareAndSwap(nil, fmt.Sprintf("lane %d: a waiter with a 3s deadline: %v", lane, err))
						}
					}
				default: // a Readiness user
					r, err := p.Watch(k)
					if err != nil {
						continue
					}
					if cp, err := p.ClaimCreate(k, lim); err == nil {
						r.Close()
						hold(rng, cp)
						continue
					}
					select {
					case <-r.Ready():
						switch rng.IntN(3) {
						case 0: // leave the unit to the next one
							r.Close()
						default:
							cp, err := p.ClaimCreate(k, lim)
							r.Close()
							if err == nil {
								hold(rng, cp)
							}
						}
					case <-time.After(time.Duration(rng.IntN(2000)) * time.Microsecond):
						r.Close()
					}
				}
			}
		}()
	}
	// Now and then a lane leaves with what it holds and waits for, and a
	// new process joins in its place.
	wg.Add(1)
	go func() {
		defer wg.Done()
		rng := rand.New(rand.NewPCG(seed, 1000))
		for !stop.Load() {
			time.Sleep(time.Duration(100+rng.IntN(200)) * time.Millisecond)
			l := rng.IntN(lanes)
			mu.Lock()
			ps[l].Close()
			p, err := Open(spec, opts)
			if err != nil {
				mu.Unlock()
				t.Error(err)
				return
			}
			ps[l] = p
			mu.Unlock()
		}
	}()
	var bad string
	start := time.Now()
	var since time.Time
	for time.Since(start) < dur && bad == "" {
		time.Sleep(time.Millisecond)
		ref, ok := mon.lookupKey(k)
		if !ok {
			continue
		}
		c := atomic.LoadUint64(mon.seg.u64(mon.seg.keyOff(ref.idx) + kfCtl))
		waiting := registeredWaiters(mon, k)
		if kTotal(c) < max && waiting > 0 && longWaits.Load() > 0 {
			if since.IsZero() {
				since = time.Now()
			} else if time.Since(since) > 750*time.Millisecond {
				bad = fmt.Sprintf("budget %d of %d taken, %d waiters registered, %d of them parked for 3s, for %v", kTotal(c), max, waiting, longWaits.Load(), time.Since(since).Round(time.Millisecond))
			}
		} else {
			since = time.Time{}
		}
	}
	stop.Store(true)
	wg.Wait()
	t.Logf("%d units acquired, %d timeouts", acquired.Load(), timeouts.Load())
	if bad != "" {
		t.Fatal(bad)
	}
	if v := longFail.Load(); v != nil {
		t.Fatal(v)
	}
	if acquired.Load() == 0 {
		t.Fatal("nothing acquired")
	}
}
