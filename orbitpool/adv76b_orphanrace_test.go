package orbitpool

import (
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestAdv76bOrphanStaleRead: Reconcile judges a bit on the ticket read
// first and the word after. A ticket read as 0 just before a new
// reservation stamps it and sets the bit looks like an orphan bit (no
// ticket); seen so twice a timeout apart, it is dropped without taking the
// ticket, and the live reservation's ticket stays stamped over a clear bit
// (its lease is refused, the bit out of use while its reserver lives). The
// reservers here never withdraw, the owner reconciles in a loop with an
// instant timeout: once all stop, no ticket may be left.
func TestAdv76bOrphanStaleRead(t *testing.T) {
	spec := PoolSpec{Lanes: 6, Keys: 2, ResourcesPerLane: 1, Path: filepath.Join(t.TempDir(), "seg")}
	open := opener(t, spec, Options{ReconcileInterval: time.Hour, ReservationTimeout: time.Nanosecond})
	owner := open()
	id, err := owner.Register(Key{0xa76b, 70}, 4)
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var n atomic.Int64
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			owner.Reconcile()
		}
	}()
	for range 3 {
		r := open()
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				l, err := r.Reserve(id)
				if err != nil {
					continue
				}
				n.Add(1)
				if e, err := owner.Accept(l); err == nil {
					e.Complete()
				}
			}
		}()
	}
	time.Sleep(3 * time.Second)
	close(stop)
	wg.Wait()
	owner.Reconcile()
	owner.Reconcile()
	t.Logf("%d reservations", n.Load())
	noTickets(t, owner, id)
}
