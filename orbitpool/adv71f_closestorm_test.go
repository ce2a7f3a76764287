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

// TestAdv71fCloseStormCapacity: 130 pools on one segment (waiter masks in
// three words); one owner registers a resource of capacity 2 under a key
// capped at one resource, and the pools of lanes 60..129 keep acquiring it
// (leases) while a closer closes random client pools in the middle of their
// waits and opens new ones, which take the freed lanes (so grants a closed
// pool passes on, and grants to its old lane, meet the lane's new process).
// Asserts: the leases held at once never exceed the capacity; nobody is ever
// told to create (MaxResources 1 is taken); no waiter of an open pool waits
// out its (long) deadline while leases come and go, i.e. no wake-up is lost
// or left on a lane nobody rings; and at the end the resource's slot word
// counts no use or reservation.
func TestAdv71fCloseStormCapacity(t *testing.T) {
	const lanes, capacity = 130, 2
	spec := PoolSpec{Path: filepath.Join(t.TempDir(), "seg"), Lanes: lanes, Keys: 4, ResourcesPerLane: 2}
	opts := Options{ReconcileInterval: time.Hour, ReservationTimeout: time.Hour}

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
		if ps[i].Lane() != i {
			t.Fatalf("pool %d on lane %d", i, ps[i].Lane())
		}
	}
	owner := ps[0]
	k := Key{0xad71f, 1}
	lim := Limits{MaxResources: 1}
	r, err := owner.Register(k, capacity)
	if err != nil {
		t.Fatal(err)
	}

	var (
		inUse, maxInUse atomic.Int64
		served          atomic.Int64
		stop            atomic.Bool
		wg              sync.WaitGroup
		failMu          sync.Mutex
		fails           []string
	)
	fail := func(s string) {
		failMu.Lock()
		if len(fails) < 10 {
			fails = append(fails, s)
		}
		failMu.Unlock()
	}
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
			switch pl.Kind {
			case PlanReuseRemote:
				n := inUse.Add(1)
				for {
					m := maxInUse.Load()
					if n <= m || maxInUse.CompareAndSwap(m, n) {
						break
					}
				}
				served.Add(1)
				time.Sleep(time.Duration(rand.IntN(300)) * time.Microsecond)
				inUse.Add(-1)
				owner.Withdraw(pl.Lease)
			case PlanCreate:
				fail("told to create past MaxResources 1")
				pl.Permit.Close()
				return
			default:
				fail("unexpected plan " + pl.Kind.String())
				return
			}
		}
	}
	var cmu sync.Mutex // guards ps[60:]
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
		cmu.Lock()
		old := ps[i]
		cmu.Unlock()
		if err := old.Close(); err != nil {
			t.Error(err)
			break
		}
		closes++
		np := open()
		if np == nil {
			break
		}
		if np.Lane() != i {
			t.Errorf("new pool took lane %d, not the freed %d", np.Lane(), i)
		}
		cmu.Lock()
		ps[i] = np
		cmu.Unlock()
		start(np)
		time.Sleep(time.Duration(rand.IntN(3000)) * time.Microsecond)
	}
	stop.Store(true)
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("workers did not finish")
	}
	for _, f := range fails {
		t.Error(f)
	}
	if m := maxInUse.Load(); m > capacity {
		t.Errorf("%d leases held at once on a resource of capacity %d", m, capacity)
	}
	off := owner.seg.slotOff(r.Lane(), r.Slot())
	if w := atomic.LoadUint64(owner.seg.u64(off + slWord)); wUse(w)+wPendN(w) != 0 {
		t.Errorf("resource slot word after the storm: %d uses, %d reservations", wUse(w), wPendN(w))
	}
	t.Logf("%d closes, %d leases served", closes, served.Load())
}

func adv71fItoa(n int) string {
	if n == 0 {
		return "0"
	}
	var b [20]byte
	i := len(b)
	neg := n < 0
	if neg {
		n = -n
	}
	for ; n > 0; n /= 10 {
		i--
		b[i] = byte('0' + n%10)
	}
	if neg {
		i--
		b[i] = '-'
	}
	return string(b[i:])
}
