package orbitpool

import (
	"context"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// adv71dFleet opens a segment of lanes lanes with a pool on each, and keeps
// those on the lanes named, closing the others.
func adv71dFleet(t *testing.T, lanes int, keep []int, opts Options) map[int]*Pool {
	t.Helper()
	spec := PoolSpec{Path: filepath.Join(t.TempDir(), "seg"), Lanes: lanes, Keys: 8, ResourcesPerLane: 8}
	open := opener(t, spec, opts)
	ps := map[int]*Pool{}
	var drop []*Pool
	for range lanes {
		p := open()
		if slices.Contains(keep, p.Lane()) {
			ps[p.Lane()] = p
		} else {
			drop = append(drop, p)
		}
	}
	for _, p := range drop {
		p.Close()
	}
	if len(ps) != len(keep) {
		t.Fatalf("kept %d pools of %d", len(ps), len(keep))
	}
	return ps
}

// TestAdv71dTicketOrderAcrossMaskWords: waiters in lanes of all four words of
// a 256-lane segment's masks (both ends of each word), registered one after
// the other in a shuffled order of lanes, on a key with one unit: with no
// order window, each unit returned goes to the oldest waiter of the fleet,
// so they are served exactly in the order they registered, whatever words
// their lanes' bits are in.
func TestAdv71dTicketOrderAcrossMaskWords(t *testing.T) {
	lanes := []int{0, 1, 63, 64, 127, 128, 191, 192, 254, 255}
	ps := adv71dFleet(t, 256, lanes, Options{ReconcileInterval: time.Hour, ReservationTimeout: time.Hour})
	k := Key{0xad71d, 2}
	lim := Limits{MaxResources: 1}
	owner := ps[128]
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	pl, err := owner.Acquire(ctx, k, LocalFirst{}, lim)
	if err != nil || pl.Kind != PlanCreate {
		t.Fatalf("creation: %v %v", pl.Kind, err)
	}
	first, err := pl.Permit.RegisterAndAccept(1)
	if err != nil {
		t.Fatal(err)
	}
	ref, _ := owner.lookupKey(k)
	s := owner.seg

	rng := rand.New(rand.NewPCG(71, 0xd))
	var order []int // lanes, in registration order
	for range 3 {
		order = append(order, lanes...)
	}
	rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })

	var (
		mu     sync.Mutex
		served []int // waiter numbers, in the order they were served
		wg     sync.WaitGroup
		errs   atomic.Int32
	)
	for i, l := range order {
		p := ps[l]
		before := atomic.LoadUint32(s.u32(s.waitOff(l, ref.idx)))
		wg.Add(1)
		go func() {
			defer wg.Done()
			pl, err := p.Acquire(ctx, k, LocalFirst{}, lim)
			if err != nil {
				errs.Add(1)
				t.Errorf("waiter %d (lane %d): %v", i, l, err)
				return
			}
			mu.Lock()
			served = append(served, i)
			mu.Unlock()
			switch pl.Kind {
			case PlanReuseLocal:
				pl.Execution.Complete()
			case PlanReuseRemote:
				p.Withdraw(pl.Lease)
			default:
				t.Errorf("waiter %d (lane %d) got %v", i, l, pl.Kind)
			}
		}()
		// Registered before the next one starts: tickets in this order.
		for atomic.LoadUint32(s.u32(s.waitOff(l, ref.idx))) != before+1 {
			if ctx.Err() != nil {
				t.Fatalf("waiter %d (lane %d) never registered", i, l)
			}
			time.Sleep(200 * time.Microsecond)
		}
	}
	first.Complete()
	wg.Wait()
	if errs.Load() != 0 {
		t.FailNow()
	}
	for i, w := range served {
		if w != i {
			t.Fatalf("served out of ticket order across mask words: %v (lanes in registration order %v)", served, order)
		}
	}
}
