package orbitpool

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestAdv76aWatchRoomRaceAcrossKeys is the public-API race behind
// TestAdv76aStaleWatchRefSparesOtherKeysWatch: in a one-entry table, three
// goroutines watch key A and close the watch at once, over and over, while
// a fourth does the same for key B, holding its watch a little longer, so
// the entry passes between the two keys. No unit of either key ever comes
// back and the pool stays open, so no watch may ever be woken (doc: Ready is closed when a unit came back, or when the
// pool closes; a watch ends under it only on a corrupt segment).
func TestAdv76aWatchRoomRaceAcrossKeys(t *testing.T) {
	p := openShared(t, PoolSpec{Lanes: 2, Keys: 1, ResourcesPerLane: 2}, 1)[0]
	keys := []Key{{0xa76e, 1}, {0xa76e, 2}}
	var spurious, armed atomic.Int64
	var first atomic.Pointer[string]
	stop := time.Now().Add(3 * time.Second)
	var wg sync.WaitGroup
	for g := range 4 { // three goroutines on A, one on B
		wg.Add(1)
		go func() {
			defer wg.Done()
			gi := 0 // key A
			if g == 0 {
				gi = 1 // key B, whose watch is held a little longer
			}
			k := keys[gi]
			for time.Now().Before(stop) && spurious.Load() == 0 {
				w, err := p.WatchRoom(k)
				if err != nil {
					continue // ErrFull: the other key holds the entry
				}
				armed.Add(1)
				for range 3 {
					if ready(w.Ready()) {
						if spurious.Add(1) == 1 {
							m := "watch of key " + string(rune('A'+gi)) + " woken with no unit back and the pool open"
							if u := w.Rearm(); u == 0 && ready(w.Ready()) {
								m += "; Rearm returned 0 and left Ready closed: the watch is dead"
							}
							first.Store(&m)
						}
						break
					}
					time.Sleep(time.Duration(gi*20) * time.Microsecond)
				}
				w.Close()
			}
		}()
	}
	wg.Wait()
	t.Logf("%d watches armed", armed.Load())
	if n := spurious.Load(); n > 0 {
		t.Errorf("%d spurious wake-ups; first: %s", n, *first.Load())
	}
	if spurious.Load() == 0 && armed.Load() < 100 {
		t.Errorf("only %d watches armed: the race was not exercised", armed.Load())
	}
}
