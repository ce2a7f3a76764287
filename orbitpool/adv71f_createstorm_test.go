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

// TestAdv71fCloseStormCreate: 130 pools on one segment; the pools of lanes
// 60..129 keep acquiring a key capped at 2 resources of capacity 1, creating
// them, using them (local reuse and leases) and unregistering the ones they
// created, while a closer closes random ones of them mid-wait, mid-use and
// mid-creation and opens new pools on the freed lanes. Asserts: the key's
// count of resources and creations (kTotal, sampled throughout, and the live
// slots of the key) never exceeds MaxResources; no waiter of an open pool
// waits out its 20 s deadline (a wake-up lost between closes would leave one
// asleep while budget is free).
func TestAdv71fCloseStormCreate(t *testing.T) {
	const lanes, maxRes = 130, 2
	spec := PoolSpec{Path: filepath.Join(t.TempDir(), "seg"), Lanes: lanes, Keys: 4, ResourcesPerLane: 2}
	opts := Options{ReconcileInterval: 100 * time.Millisecond, ReservationTimeout: 2 * time.Second}
	var mu sync.Mutex
	var all []*Pool
	open := func() *Pool {
		p, err := Open(spec, opts)
		if err != nil {
			t.Error(err)
			return nil
		}
		mu.Lock()
		all = append(all, p)
		mu.Unlock()
		return p
	}
	defer func() {
		mu.Lock()
		defer mu.Unlock()
		for _, p := range all {
			p.Close()
		}
	}()
	ps := make([]*Pool, lanes)
	for i := range ps {
		if ps[i] = open(); ps[i] == nil {
			t.FailNow()
		}
	}
	k := Key{0xad71f, 40}
	lim := Limits{MaxResources: maxRes}
	if _, err := ps[0].Register(Key{0xad71f, 41}, 1); err != nil { // some other key in the table
		t.Fatal(err)
	}
	var (
		stop, watchStop atomic.Bool
		wg, wwg         sync.WaitGroup
		failMu          sync.Mutex
		fails           []string
		served          atomic.Int64
	)
	fail := func(s string) {
		failMu.Lock()
		if len(fails) < 10 {
			fails = append(fails, s)
		}
		failMu.Unlock()
	}
	s := ps[0].seg
	// The watcher: the key's total never passes MaxResources.
	wwg.Add(1)
	go func() {
		defer wwg.Done()
		for !watchStop.Load() {
			if ref, ok := ps[0].lookupKey(k); ok {
				c := atomic.LoadUint64(s.u64(s.keyOff(ref.idx) + kfCtl))
				if kState(c) == keyLive && kTotal(c) > maxRes {
					fail("key total " + adv71fItoa(kTotal(c)) + " > MaxResources")
				}
			}
			time.Sleep(50 * time.Microsecond)
		}
	}()
	worker := func(p *Pool) {
		defer wg.Done()
		for !stop.Load() {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			pl, err := p.Acquire(ctx, k, LocalFirst{}, lim)
			cancel()
			if errors.Is(err, ErrClosed) {
				return
			}
			if err != nil {
				fail("lane " + adv71fItoa(p.Lane()) + ": " + err.Error())
				return
			}
			served.Add(1)
			pause := func() { time.Sleep(time.Duration(rand.IntN(300)) * time.Microsecond) }
			switch pl.Kind {
			case PlanCreate:
				e, err := pl.Permit.RegisterAndAccept(1)
				if err != nil {
					pl.Permit.Close()
					if !errors.Is(err, ErrClosed) {
						fail("register: " + err.Error())
					}
					return
				}
				pause()
				e.Complete()
				if rand.IntN(2) == 0 {
					if err := p.Unregister(e.ID()); err != nil && !errors.Is(err, ErrClosed) && !errors.Is(err, ErrStale) {
						fail("unregister: " + err.Error())
					}
				}
			case PlanReuseLocal:
				pause()
				pl.Execution.Complete()
				if rand.IntN(3) == 0 {
					if err := p.Unregister(pl.Execution.ID()); err != nil && !errors.Is(err, ErrClosed) && !errors.Is(err, ErrStale) && !errors.Is(err, ErrBusy) {
						fail("unregister: " + err.Error())
					}
				}
			case PlanReuseRemote:
				pause()
				p.Withdraw(pl.Lease)
			}
		}
	}
	start := func(p *Pool) {
		for range 2 {
			wg.Add(1)
			go worker(p)
		}
	}
	for i := 60; i < lanes; i++ {
		start(ps[i])
	}
	deadline := time.Now().Add(3 * time.Second)
	closes := 0
	for time.Now().Before(deadline) && !t.Failed() {
		i := 60 + rand.IntN(lanes-60)
		if err := ps[i].Close(); err != nil {
			t.Error(err)
			break
		}
		closes++
		np := open()
		if np == nil {
			break
		}
		ps[i] = np
		start(np)
		time.Sleep(time.Duration(rand.IntN(3000)) * time.Microsecond)
	}
	stop.Store(true)
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		t.Error("workers did not finish")
	}
	watchStop.Store(true)
	wwg.Wait()
	for _, f := range fails {
		t.Error(f)
	}
	t.Logf("%d closes, %d served", closes, served.Load())
}
