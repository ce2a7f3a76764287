package orbitpool

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

var mpKeyCapacity = Key{Hi: 0x6d70, Lo: 13}

// mpEpochFile maps the 8-byte file at path: the parent's capacity epoch,
// which children read before each acquisition.
func mpEpochFile(path string, create bool) (*uint64, func(), error) {
	flags := os.O_RDWR
	if create {
		flags |= os.O_CREATE | os.O_EXCL
	}
	f, err := os.OpenFile(path, flags, 0o600)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	if create {
		if err := f.Truncate(8); err != nil {
			return nil, nil, err
		}
	}
	b, err := unix.Mmap(int(f.Fd()), 0, 8, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, nil, err
	}
	return (*uint64)(unsafe.Pointer(&b[0])), func() { unix.Munmap(b) }, nil
}

// mpRoleCapacityTaker acquires the parent's resource for Dur, as fast as the
// resource lets it, and hands each lease to the parent tagged with the
// capacity epoch it read before acquiring.
func mpRoleCapacityTaker(c *mpChildCtx) error {
	p, err := c.open()
	if err != nil {
		return err
	}
	defer p.Close()
	epoch, unmap, err := mpEpochFile(filepath.Join(c.args.Dir, "epoch"), false)
	if err != nil {
		return err
	}
	defer unmap()
	c.send(mpMsg{Type: "ready", Lane: p.Lane(), PID: os.Getpid()})
	if _, err := c.expect("go"); err != nil {
		return err
	}
	n := 0
	for end := time.Now().Add(c.args.Dur); time.Now().Before(end); {
		e0 := atomic.LoadUint64(epoch)
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		plan, err := p.Acquire(ctx, c.args.Key, LocalFirst{}, Limits{MaxResources: 1})
		cancel()
		var we *WaitError
		if errors.As(err, &we) {
			continue // drained for longer than that
		}
		if err != nil {
			return err
		}
		if plan.Kind != PlanReuseRemote {
			return errors.New("plan " + plan.Kind.String() + ", want reuse-remote")
		}
		c.send(mpMsg{Type: "lease", Lease: mpLeaseBytes(plan.Lease), T: int64(e0)})
		n++
	}
	c.send(mpMsg{Type: "done", N: n})
	c.untilParentLeaves()
	return nil
}

// TestMultiProcessSetCapacity changes the capacity of a resource (lowering,
// draining to 0, raising) while three child processes reserve it as fast as
// they can through Acquire. Every lease carries the epoch of the capacity
// that was current before its acquisition began; at each Accept, the grants
// of the current epoch in flight never exceed its capacity, and children
// parked on a drained resource are woken, across processes, when it is
// raised again.
func TestMultiProcessSetCapacity(t *testing.T) {
	p, spec := mpOpenParent(t, Options{ReconcileInterval: 50 * time.Millisecond, ReservationTimeout: 5 * time.Second})
	dir := t.TempDir()
	epoch, unmap, err := mpEpochFile(filepath.Join(dir, "epoch"), true)
	if err != nil {
		t.Fatal(err)
	}
	defer unmap()
	id, err := p.Register(mpKeyCapacity, 8)
	if err != nil {
		t.Fatal(err)
	}
	dur := mpScale(2*time.Second, time.Second)
	a := mpArgs{Spec: spec, Reconcile: 50 * time.Millisecond, ResTimeout: 5 * time.Second, Key: mpKeyCapacity, Dir: dir, Dur: dur}
	var kids []*mpChild
	for range 3 {
		kids = append(kids, mpStart(t, "capacity-taker", a))
	}
	for _, k := range kids {
		k.expect("ready", 30*time.Second)
	}
	var (
		mu       sync.Mutex
		capOf    = map[uint64]int{0: 8}
		inflight = map[uint64]int{}
		accepted atomic.Int64
		raisedTo atomic.Int64 // accepts right after a drain ended
	)
	var wg sync.WaitGroup
	done := make(chan int, len(kids))
	for i, k := range kids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(i), 2))
			var hold sync.WaitGroup
			defer hold.Wait()
			for {
				m, ok := <-k.msgs
				if !ok {
					t.Errorf("child %d exited early: %v%s", i, k.werr, k.diag())
					return
				}
				switch m.Type {
				case "done":
					done <- m.N
					return
				case "error":
					t.Errorf("child %d: %s", i, m.Err)
					return
				}
				var l Lease
				if err := l.UnmarshalBinary(m.Lease); err != nil {
					t.Error(err)
					return
				}
				e, err := p.Accept(l)
				if err != nil {
					t.Errorf("accept: %v", err)
					return
				}
				e0 := uint64(m.T)
				mu.Lock()
				cur := atomic.LoadUint64(epoch)
				inflight[e0]++
				if e0 == cur && inflight[e0] > capOf[e0] {
					t.Errorf("epoch %d: %d grants in flight, capacity %d", e0, inflight[e0], capOf[e0])
				}
				if capOf[cur] > 0 && capOf[cur-1] == 0 && cur > 0 {
					raisedTo.Add(1)
				}
				mu.Unlock()
				accepted.Add(1)
				d := time.Duration(rng.IntN(300)) * time.Microsecond
				hold.Add(1)
				go func() {
					defer hold.Done()
					time.Sleep(d)
					mu.Lock()
					inflight[e0]--
					mu.Unlock()
					e.Complete()
				}()
			}
		}()
	}
	for _, k := range kids {
		k.send(mpMsg{Type: "go"})
	}
	caps := []int{1, 2, 3, 5, 8}
	rng := rand.New(rand.NewPCG(3, 3))
	changes := 0
	for end := time.Now().Add(dur - 100*time.Millisecond); time.Now().Before(end); changes++ {
		c := caps[rng.IntN(len(caps))]
		if changes%4 == 3 {
			c = 0
		}
		mu.Lock()
		err := p.SetCapacity(id, c)
		e := atomic.LoadUint64(epoch) + 1
		capOf[e] = c
		atomic.StoreUint64(epoch, e)
		mu.Unlock()
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	mu.Lock()
	if err := p.SetCapacity(id, 8); err != nil {
		t.Fatal(err)
	}
	e := atomic.LoadUint64(epoch) + 1
	capOf[e] = 8
	atomic.StoreUint64(epoch, e)
	mu.Unlock()
	wg.Wait()
	close(done)
	total := 0
	for n := range done {
		total += n
	}
	for _, k := range kids {
		k.finish(10 * time.Second)
	}
	if int64(total) != accepted.Load() {
		t.Errorf("children sent %d leases, %d accepted", total, accepted.Load())
	}
	if accepted.Load() < int64(changes) || raisedTo.Load() == 0 {
		t.Errorf("%d grants over %d capacity changes, %d right after a drain ended: the children starved", accepted.Load(), changes, raisedTo.Load())
	}
	snap, _ := p.Snapshot()
	if ks := mpKS(snap, mpKeyCapacity); ks.InUse != 0 || ks.Pending != 0 || ks.Waiting != 0 {
		t.Errorf("after the run: %+v, want nothing in use, pending or waiting", ks)
	}
	t.Logf("%d grants over %d capacity changes (%d right after a drain ended)", accepted.Load(), changes, raisedTo.Load())
}

// mpRoleCapacityWindow reserves the parent's resource once, stopping in the
// window between its read of the capacity and its compare-and-swap until the
// parent says it changed the capacity, and reports what it got.
func mpRoleCapacityWindow(c *mpChildCtx) error {
	p, err := c.open()
	if err != nil {
		return err
	}
	defer p.Close()
	cands, err := p.Candidates(c.args.Key, nil)
	if err != nil || len(cands) != 1 {
		return fmt.Errorf("candidates %+v, %v: want the parent's one", cands, err)
	}
	var once sync.Once
	var herr error
	h := func(ResourceID) {
		once.Do(func() {
			c.send(mpMsg{Type: "window"})
			_, herr = c.expect("lowered")
		})
	}
	testHookGrant.Store(&h)
	l, err := p.Reserve(cands[0].ID)
	testHookGrant.Store(nil)
	if herr != nil {
		return herr
	}
	switch {
	case errors.Is(err, ErrBusy):
		c.send(mpMsg{Type: "busy"})
	case err != nil:
		return err
	default:
		c.send(mpMsg{Type: "lease", Lease: mpLeaseBytes(l)})
	}
	c.untilParentLeaves()
	return nil
}

// TestMultiProcessSetCapacityInGrantWindow: a child's Reserve reads the
// capacity (4, two in use), and the parent lowers it to 2 before the child's
// compare-and-swap. The reservation is refused; without the re-check after
// the swap it would be granted, a third unit under capacity 2.
func TestMultiProcessSetCapacityInGrantWindow(t *testing.T) {
	p, spec := mpOpenParent(t, Options{ReconcileInterval: 50 * time.Millisecond, ReservationTimeout: 5 * time.Second})
	id, err := p.Register(mpKeyCapacity, 4)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		l, err := p.Reserve(id)
		if err != nil {
			t.Fatal(err)
		}
		e, err := p.Accept(l)
		if err != nil {
			t.Fatal(err)
		}
		defer e.Complete()
	}
	k := mpStart(t, "capacity-window", mpArgs{Spec: spec, Reconcile: 50 * time.Millisecond, ResTimeout: 5 * time.Second, Key: mpKeyCapacity})
	k.expect("window", 30*time.Second)
	if err := p.SetCapacity(id, 2); err != nil {
		t.Fatal(err)
	}
	k.send(mpMsg{Type: "lowered"})
	m := k.recv(30 * time.Second)
	switch m.Type {
	case "busy":
	case "lease":
		var l Lease
		if err := l.UnmarshalBinary(m.Lease); err != nil {
			t.Fatal(err)
		}
		if e, err := p.Accept(l); err == nil {
			defer e.Complete()
		}
		t.Errorf("the child was granted a unit after the capacity was lowered to 2 with 2 in use")
	default:
		t.Fatalf("child sent %q (%s), want busy", m.Type, m.Err)
	}
	c, _ := p.Candidates(mpKeyCapacity, nil)
	if len(c) != 1 || c[0].InUse+c[0].Pending != 2 {
		t.Errorf("after the child's reserve: %+v, want 2 in use and nothing pending", c)
	}
	k.finish(10 * time.Second)
}
