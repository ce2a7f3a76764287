package orbitpool

import (
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

var mpKeyRoom = Key{Hi: 0x6d70, Lo: 13}

func init() { mpMoreRoles["room-watcher"] = mpRoleRoomWatcher }

// mpRoleRoomWatcher watches mpKeyRoom from 4 goroutines, each arming (a new
// watch, or Rearm), looking for room on a sibling's resource, and waiting
// for the watch if it saw none, until the parent says "stop"; it then
// reports how many waits it woke from (N), how many the look made needless
// (T) and how many outlasted args.Dur (T2). It says "ready" once its first
// watch is armed.
func mpRoleRoomWatcher(c *mpChildCtx) error {
	p, err := c.open()
	if err != nil {
		return err
	}
	defer p.Close()
	var stop atomic.Bool
	var woken, looked, missed atomic.Int64
	room := func() bool {
		cs, err := p.Candidates(mpKeyRoom, nil)
		if err != nil {
			return false
		}
		for _, c := range cs {
			if !c.Local && c.Capacity-c.InUse-c.Pending > 0 {
				return true
			}
		}
		return false
	}
	var wg sync.WaitGroup
	armed := make(chan struct{}, 4)
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var w *RoomWatch
			defer func() {
				if w != nil {
					w.Close()
				}
			}()
			for i := 0; !stop.Load(); i++ {
				if w == nil || (g+i)%3 == 0 {
					if w != nil {
						w.Close()
					}
					var err error
					if w, err = p.WatchRoom(mpKeyRoom); err != nil {
						c.fail("watch: %v", err)
						return
					}
				} else {
					w.Rearm()
				}
				if i == 0 {
					armed <- struct{}{}
				}
				if room() {
					// It would take the unit here; the parent
					// takes it back in a moment.
					looked.Add(1)
					time.Sleep(200 * time.Microsecond)
					continue
				}
				select {
				case <-w.Ready():
					woken.Add(1)
				case <-time.After(c.args.Dur):
					if !stop.Load() {
						missed.Add(1)
					}
				}
			}
		}()
	}
	for range 4 {
		<-armed
	}
	c.send(mpMsg{Type: "ready", Lane: p.Lane(), PID: os.Getpid()})
	if _, err := c.expect("stop"); err != nil {
		return err
	}
	stop.Store(true)
	wg.Wait()
	c.send(mpMsg{Type: "counts", N: int(woken.Load()), T: looked.Load(), T2: missed.Load()})
	c.untilParentLeaves()
	return nil
}

// TestMultiProcessRoomWatch: watcher processes wait on a key whose only
// resource, the parent's, is busy for a millisecond and idle for an instant,
// over and over. Every wait of theirs ends with a wake, never by outlasting
// a second while units come back that fast: no wake is lost across
// processes. A watcher SIGKILLed with its watches armed leaves its bit in
// the key's watch mask only until its lane is reclaimed; the units the
// parent gives back after that are not counted for it.
func TestMultiProcessRoomWatch(t *testing.T) {
	p, spec := mpOpenParent(t, Options{ReconcileInterval: 10 * time.Millisecond, ReservationTimeout: 100 * time.Millisecond})
	if _, err := p.Register(mpKeyRoom, 1); err != nil {
		t.Fatal(err)
	}
	// The watchers' dispatchers wake by themselves only every 2s: within
	// a second, only a ring wakes a watch.
	args := mpArgs{Spec: spec, Reconcile: 2 * time.Second, ResTimeout: 100 * time.Millisecond, Dur: time.Second}
	watcher := mpStart(t, "room-watcher", args)
	victim := mpStart(t, "room-watcher", args)
	watcher.expect("ready", 10*time.Second)
	vl := victim.expect("ready", 10*time.Second).Lane

	var stop atomic.Bool
	var cycles atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		for !stop.Load() {
			// Busy for a millisecond, idle for an instant: the
			// watchers' looks seldom find it idle, so they wait.
			e := useLocalOnceErr(p, mpKeyRoom)
			if e == nil {
				t.Error("the parent's resource was not free: a watcher took it")
				return
			}
			time.Sleep(time.Millisecond)
			e.Complete()
			cycles.Add(1)
		}
	}()
	defer func() {
		stop.Store(true)
		<-done
	}()
	time.Sleep(mpScale(1500*time.Millisecond, 700*time.Millisecond))
	victim.kill()
	ref, err := p.internKey(mpKeyRoom)
	if err != nil {
		t.Fatal(err)
	}
	s := p.seg
	deadline := time.Now().Add(5 * time.Second)
	for atomic.LoadUint64(s.u64(s.watchOff(ref.idx, vl)))&laneBit(vl) != 0 {
		if time.Now().After(deadline) {
			t.Fatal("a killed watcher's bit is still in the key's watch mask 5s after")
		}
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(mpScale(1000*time.Millisecond, 500*time.Millisecond))
	watcher.send(mpMsg{Type: "stop"})
	m := watcher.expect("counts", 10*time.Second)
	stop.Store(true)
	<-done
	if m.T2 != 0 {
		t.Fatalf("%d of the watcher's waits outlasted %v while the parent gave back %d units (woken %d times, %d looks found room)", m.T2, args.Dur, cycles.Load(), m.N, m.T)
	}
	t.Logf("%d units given back; the watcher was woken %d times, its look found room %d times", cycles.Load(), m.N, m.T)
	if m.N == 0 {
		t.Fatalf("the watcher was never woken in %d units given back: it only looked", cycles.Load())
	}
	watcher.finish(5 * time.Second)
	w := atomic.LoadUint64(s.u64(s.watchOff(ref.idx, 0)))
	if w != 0 {
		t.Fatalf("watch mask %#x after every watcher left", w)
	}
}

// useLocalOnceErr takes p's resource of k for one use, or returns nil if it
// has no room now.
func useLocalOnceErr(p *Pool, k Key) *Execution {
	ref, err := p.internKey(k)
	if err != nil {
		return nil
	}
	e, _ := p.takeLocal(ref)
	return e
}
