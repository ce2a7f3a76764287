package orbitpool

import (
	"errors"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestAdv12TableReconcileAfterCloseLeavesLaneAlone: a caller's Reconcile
// (the proxy runs one when a sibling is gone) that passed its closed check
// just before Close must not act on the lane Close released: healing "its"
// lane record then overwrites the record of the process that joined the lane
// since, whose reservations every owner then drops as a dead process's.
func TestAdv12TableReconcileAfterCloseLeavesLaneAlone(t *testing.T) {
	spec := small
	spec.Path = filepath.Join(t.TempDir(), "seg")
	// No housekeeping of its own: the dispatcher must not run Reconcile.
	opts := Options{ReconcileInterval: time.Hour, ReservationTimeout: time.Hour}
	open := opener(t, spec, opts)
	a := open() // lane 0, closed while its Reconcile is on the way
	c := open() // lane 1, keeps the segment and owns a resource
	if a.Lane() != 0 || c.Lane() != 1 {
		t.Fatalf("lanes %d and %d, want 0 and 1", a.Lane(), c.Lane())
	}
	id, err := c.Register(Key{0xad12, 1}, 1)
	if err != nil {
		t.Fatal(err)
	}

	// Hold a's reconcile lock so that its Reconcile stops after the closed
	// check, the state a caller racing Close is in.
	a.reconcileMu.Lock()
	locked := true
	defer func() {
		if locked {
			a.reconcileMu.Unlock()
		}
	}()
	done := make(chan error, 1)
	go func() { done <- a.Reconcile() }()
	if !adv12WaitBlocked(5*time.Second, "(*Pool).Reconcile", "sync.(*Mutex).Lock") {
		t.Fatal("Reconcile did not reach its lock in 5s")
	}
	closed := make(chan error, 1)
	go func() { closed <- a.Close() }()
	// Close either finishes (the bug's order: then a process joins the
	// lane it released) or waits for the Reconcile in progress.
	var b *Pool
	select {
	case err := <-closed:
		if err != nil {
			t.Fatal(err)
		}
		b = open()
	case <-time.After(200 * time.Millisecond):
	}
	a.reconcileMu.Unlock()
	locked = false
	select {
	case err := <-done:
		if !errors.Is(err, ErrClosed) {
			t.Errorf("Reconcile that raced Close: %v, want ErrClosed", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Reconcile did not return in 10s")
	}
	if b == nil {
		select {
		case err := <-closed:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("Close did not return in 10s")
		}
		b = open()
	}
	if b.Lane() != 0 {
		t.Fatalf("b joined lane %d, want 0, which a released", b.Lane())
	}
	l, err := b.Reserve(id)
	if err != nil {
		t.Fatal(err)
	}
	// A second late Reconcile of a, as from another request goroutine.
	if err := a.Reconcile(); !errors.Is(err, ErrClosed) {
		t.Errorf("Reconcile of a closed pool: %v, want ErrClosed", err)
	}
	s := b.seg
	if got, want := atomic.LoadUint64(s.u64(s.laneOff(0)+lnCtl)), laneCtl(b.laneGen, laneLive); got != want {
		t.Errorf("lane 0's record %#x after the closed pool's Reconcile, want b's %#x", got, want)
	}
	if err := c.Reconcile(); err != nil {
		t.Error(err)
	}
	e, err := c.Accept(l)
	if err != nil {
		t.Fatalf("b's lease refused by its owner after the closed pool's Reconcile: %v", err)
	}
	e.Complete()
}

// adv12WaitBlocked waits until some goroutine's stack shows all of frames,
// for a test that needs another goroutine parked at a known point.
func adv12WaitBlocked(d time.Duration, frames ...string) bool {
	buf := make([]byte, 1<<20)
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(time.Millisecond) {
		n := runtime.Stack(buf, true)
	next:
		for _, g := range strings.Split(string(buf[:n]), "\n\n") {
			for _, f := range frames {
				if !strings.Contains(g, f) {
					continue next
				}
			}
			return true
		}
	}
	return false
}
