package orbitpool

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestAdv71dReuseAcrossKeysHighLanes: owners on lanes of the second, third
// and fourth mask words free and re-register their slots, alternating two
// keys, while siblings on lanes of every word scan for the first key
// (Candidates, and Acquire's room walk) and reserve what they found. Every
// lease an owner accepts is on a resource of the first key, and the
// executions on it say so: a slot that moved to the other key between a
// sibling's scan and its reservation is refused as stale.
func TestAdv71dReuseAcrossKeysHighLanes(t *testing.T) {
	owners := []int{65, 130, 200, 255}
	users := []int{0, 64, 129, 254}
	ps := adv71dFleet(t, 256, append(append([]int{}, owners...), users...), Options{ReconcileInterval: time.Hour, ReservationTimeout: time.Hour})
	k1, k2 := Key{0xad71d, 5}, Key{0xad71d, 6}
	r1, err := ps[0].internKey(k1)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := ps[0].internKey(k2)
	if err != nil {
		t.Fatal(err)
	}
	stop := time.Now().Add(800 * time.Millisecond)
	var (
		wg                     sync.WaitGroup
		accepted, wrong, errsN atomic.Int64
		firstWrong             atomic.Value
	)
	leases := map[int]chan Lease{}
	for _, l := range owners {
		leases[l] = make(chan Lease, 64)
	}
	// Owners: churn slots between the keys, and accept leases.
	var churn sync.WaitGroup
	for _, l := range owners {
		p := ps[l]
		churn.Add(1)
		go func() {
			defer churn.Done()
			for i := 0; time.Now().Before(stop); i++ {
				k := k1
				if i%2 == 1 {
					k = k2
				}
				id, err := p.Register(k, 2)
				if err != nil {
					errsN.Add(1)
					t.Errorf("lane %d register: %v", l, err)
					return
				}
				if err := p.Unregister(id); err != nil {
					errsN.Add(1)
					t.Errorf("lane %d unregister: %v", l, err)
					return
				}
			}
		}()
		wg.Add(1)
		go func() {
			defer wg.Done()
			for le := range leases[l] {
				e, err := p.Accept(le)
				if err != nil {
					if !errors.Is(err, ErrStale) {
						errsN.Add(1)
						t.Errorf("lane %d accept: %v", l, err)
					}
					continue
				}
				accepted.Add(1)
				if int(e.g.key) != r1.idx {
					wrong.Add(1)
					firstWrong.CompareAndSwap(nil, e.ID())
				}
				e.Complete()
			}
		}()
	}
	var users_ sync.WaitGroup
	for i, l := range users {
		p := ps[l]
		users_.Add(1)
		go func() {
			defer users_.Done()
			var cs []Candidate
			for time.Now().Before(stop) {
				var le Lease
				if i%2 == 0 {
					var err error
					cs, err = p.Candidates(k1, cs[:0])
					if err != nil || len(cs) == 0 {
						continue
					}
					le, err = p.Reserve(cs[len(cs)-1].ID)
					if err != nil {
						continue
					}
				} else {
					ctx, cancel := context.WithTimeout(context.Background(), 2*time.Millisecond)
					pl, err := p.Acquire(ctx, k1, LocalFirst{}, Limits{MaxResources: 1})
					cancel()
					if err != nil {
						continue
					}
					if pl.Kind == PlanCreate {
						pl.Permit.Close()
						continue
					}
					if pl.Kind != PlanReuseRemote {
						t.Errorf("lane %d: %v", l, pl.Kind)
						continue
					}
					le = pl.Lease
				}
				leases[le.ID.Lane()] <- le
			}
		}()
	}
	users_.Wait()
	churn.Wait()
	for _, ch := range leases {
		close(ch)
	}
	wg.Wait()
	_ = r2
	if n := wrong.Load(); n != 0 {
		t.Fatalf("%d of %d accepted leases for key %v were on another key's resource (first %v)", n, accepted.Load(), k1, firstWrong.Load())
	}
	if errsN.Load() != 0 {
		t.FailNow()
	}
	if accepted.Load() == 0 {
		t.Fatal("no lease was accepted: the test exercised nothing")
	}
	t.Logf("%d leases accepted", accepted.Load())
}
