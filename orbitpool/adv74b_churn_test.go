package orbitpool

import (
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestAdv74bWatchChurnSettles: two processes watch and close watches of six
// keys while a third registers, uses and unregisters resources of them on a
// table of three key entries, so entries are collected and recycled under
// armed watches. Once every watch is closed: no watch bit is left for the
// watchers' lanes on any entry, their watch tables are empty, and a unit
// given back counts nothing.
func TestAdv74bWatchChurnSettles(t *testing.T) {
	spec := PoolSpec{Lanes: 4, Keys: 3, ResourcesPerLane: 4}
	ps := openShared(t, spec, 3)
	a, watchers := ps[0], ps[1:]
	keys := make([]Key, 6)
	for i := range keys {
		keys[i] = Key{0x74bc, uint64(i)}
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var armed atomic.Int64
	for _, p := range watchers {
		for g := range 3 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := rand.New(rand.NewPCG(uint64(p.lane), uint64(g)))
				var open []*RoomWatch
				for {
					select {
					case <-stop:
						for _, w := range open {
							w.Close()
						}
						return
					default:
					}
					switch {
					case len(open) < 3 && r.IntN(2) == 0:
						if w, err := p.WatchRoom(keys[r.IntN(len(keys))]); err == nil {
							open = append(open, w)
							armed.Add(1)
						}
					case len(open) > 0:
						i := r.IntN(len(open))
						if r.IntN(2) == 0 {
							if ready(open[i].Ready()) {
								open[i].Rearm()
							}
						} else {
							open[i].Close()
							open = append(open[:i], open[i+1:]...)
						}
					}
					time.Sleep(time.Duration(r.IntN(200)) * time.Microsecond)
				}
			}()
		}
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		r := rand.New(rand.NewPCG(7, 4))
		for {
			select {
			case <-stop:
				return
			default:
			}
			k := keys[r.IntN(len(keys))]
			id, err := a.Register(k, 1)
			if err != nil {
				continue
			}
			if e, err := a.Acquire(t.Context(), k, LocalOnly{}, Limits{}); err == nil && e.Execution != nil {
				e.Execution.Complete()
			}
			a.Unregister(id)
		}
	}()
	time.Sleep(1500 * time.Millisecond)
	close(stop)
	wg.Wait()
	if armed.Load() == 0 {
		t.Fatal("no watch armed")
	}
	s := a.seg
	for _, p := range watchers {
		p.watches.mu.Lock()
		n, kept := p.watches.n.Load(), len(p.watches.keys)
		p.watches.mu.Unlock()
		if n != 0 || kept != 0 {
			t.Errorf("lane %d: %d watches counted, %d key entries kept, after every watch closed", p.lane, n, kept)
		}
		for idx := range spec.Keys {
			if atomic.LoadUint64(s.u64(s.watchOff(idx, p.lane)))&laneBit(p.lane) != 0 {
				c := atomic.LoadUint64(s.u64(s.keyOff(idx) + kfCtl))
				t.Errorf("lane %d: watch bit left on entry %d (state %d gen %d) after every watch closed", p.lane, idx, kState(c), kGen(c))
			}
		}
	}
}
