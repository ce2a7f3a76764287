package orbitpool

import (
	"errors"
	"math/rand/v2"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

func init() { mpMoreRoles["adv76b-reserver"] = adv76bRoleReserver }

// adv76bRoleReserver reserves c.args.IDs at random with two goroutines
// until the parent closes its stdin: each lease is withdrawn at once, sent
// to the parent to accept, or sent and withdrawn a moment later (racing the
// parent's Accept). It stops its workers before it closes its pool.
func adv76bRoleReserver(c *mpChildCtx) error {
	p, err := c.open()
	if err != nil {
		return err
	}
	c.send(mpMsg{Type: "ready", Lane: p.lane})
	stop := make(chan struct{})
	go func() { c.untilParentLeaves(); close(stop) }()
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				l, err := p.Reserve(c.args.IDs[rand.IntN(len(c.args.IDs))])
				if err != nil {
					if !errors.Is(err, ErrBusy) {
						errs <- err
						return
					}
					time.Sleep(200 * time.Microsecond)
					continue
				}
				switch rand.IntN(3) {
				case 0:
					p.Withdraw(l)
				case 1, 2:
					b, err := l.MarshalBinary()
					if err != nil {
						errs <- err
						return
					}
					c.send(mpMsg{Type: "lease", Lease: b})
					if rand.IntN(2) == 0 {
						time.Sleep(time.Duration(rand.IntN(3000)) * time.Microsecond)
						p.Withdraw(l)
					}
				}
			}
		}()
	}
	wg.Wait()
	select {
	case err := <-errs:
		return err
	default:
	}
	return p.Close()
}

// TestAdv76bMPStoppedClaimers: reserver processes reserve, withdraw and
// hand leases to the owner (this process), which accepts them, sometimes
// twice at once, while reservations age in 3ms, the owner reconciles every
// millisecond, and the reservers are SIGSTOPped at random for several
// reservation timeouts (mid-claim, at times) and one is SIGKILLed while
// stopped. In every quiescent snapshot of the owner a resource's uses are
// exactly the executions it holds, and uses plus pending reservations stay
// within capacity; no lease is accepted twice; at the end every unit is
// back, every ticket is 0, and each resource serves its full capacity.
func TestAdv76bMPStoppedClaimers(t *testing.T) {
	spec := PoolSpec{Lanes: 6, Keys: 2, ResourcesPerLane: 2, Path: filepath.Join(t.TempDir(), "seg")}
	const timeout = 3 * time.Millisecond
	open := opener(t, spec, Options{ReconcileInterval: time.Millisecond, ReservationTimeout: timeout})
	owner := open()
	const capacity = 2
	type res struct {
		id     ResourceID
		active atomic.Int64
	}
	var rs []*res
	var ids []ResourceID
	for i := range 2 {
		id, err := owner.Register(Key{0xa76b, uint64(50 + i)}, capacity)
		if err != nil {
			t.Fatal(err)
		}
		rs = append(rs, &res{id: id})
		ids = append(ids, id)
	}
	byID := func(id ResourceID) *res {
		for _, r := range rs {
			if r.id == id {
				return r
			}
		}
		return nil
	}
	var children []*mpChild
	for range 3 {
		c := mpStart(t, "adv76b-reserver", mpArgs{Spec: spec, IDs: ids, Reconcile: time.Millisecond, ResTimeout: timeout, Lifetime: 40 * time.Second})
		children = append(children, c)
	}
	// SIGCONT every child on the way out, whatever happens (mpStart's
	// cleanup SIGKILLs them, stopped or not).
	t.Cleanup(func() {
		for _, c := range children {
			syscall.Kill(c.pid(), syscall.SIGCONT)
		}
	})
	for _, c := range children {
		c.expect("ready", 10*time.Second)
	}

	var mu sync.RWMutex
	var accepted, refused atomic.Int64
	var execs sync.WaitGroup
	accept := func(r *res, l Lease) bool {
		mu.RLock()
		defer mu.RUnlock()
		e, err := owner.Accept(l)
		if err != nil {
			refused.Add(1)
			return false
		}
		accepted.Add(1)
		if n := r.active.Add(1); n > capacity {
			t.Errorf("%d executions on %v, capacity %d", n, r.id, capacity)
		}
		execs.Add(1)
		go func() {
			defer execs.Done()
			time.Sleep(time.Duration(rand.IntN(2000)) * time.Microsecond)
			mu.RLock()
			defer mu.RUnlock()
			r.active.Add(-1)
			e.Complete()
		}()
		return true
	}

	stop := make(chan struct{})
	var wg, acc sync.WaitGroup
	for _, c := range children {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				var m mpMsg
				var ok bool
				select {
				case <-stop:
					return
				case m, ok = <-c.msgs:
				}
				if !ok {
					return
				}
				if m.Type != "lease" {
					t.Errorf("child %d: %+v", c.pid(), m)
					continue
				}
				var l Lease
				if err := l.UnmarshalBinary(m.Lease); err != nil {
					t.Errorf("lease: %v", err)
					continue
				}
				r := byID(l.ID)
				if r == nil {
					t.Errorf("lease on %v, not a resource of the test", l.ID)
					continue
				}
				if rand.IntN(3) == 0 {
					var got [2]bool
					var w2 sync.WaitGroup
					for i := range got {
						w2.Add(1)
						go func() { defer w2.Done(); got[i] = accept(r, l) }()
					}
					w2.Wait()
					if got[0] && got[1] {
						t.Errorf("lease %+v accepted twice", l)
					}
				} else {
					acc.Add(1)
					go func() { defer acc.Done(); accept(r, l) }()
				}
			}
		}()
	}
	// The monitor.
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(300 * time.Microsecond):
			}
			mu.Lock()
			for _, r := range rs {
				s := owner.seg
				w := atomic.LoadUint64(s.u64(s.slotOff(r.id.Lane(), r.id.Slot()) + slWord))
				usesHeld(t, r.id, w, r.active.Load(), capacity)
			}
			mu.Unlock()
		}
	}()
	// The stopper.
	end := time.Now().Add(4 * time.Second)
	for time.Now().Before(end) && !t.Failed() {
		c := children[rand.IntN(len(children))]
		syscall.Kill(c.pid(), syscall.SIGSTOP)
		time.Sleep(time.Duration(3+rand.IntN(15)) * time.Millisecond)
		syscall.Kill(c.pid(), syscall.SIGCONT)
		time.Sleep(time.Duration(rand.IntN(20)) * time.Millisecond)
	}
	// One dies while stopped; the others leave cleanly.
	syscall.Kill(children[0].pid(), syscall.SIGSTOP)
	time.Sleep(5 * time.Millisecond)
	children[0].kill()
	close(stop)
	wg.Wait()
	acc.Wait()
	for _, c := range children[1:] {
		go func() {
			for range c.msgs { // the leases still in flight
			}
		}()
	}
	for _, c := range children[1:] {
		c.stdin.Close()
		select {
		case <-c.done:
		case <-time.After(10 * time.Second):
			t.Errorf("child %d did not leave", c.pid())
		}
		if c.werr != nil {
			t.Errorf("child %d: %v%s", c.pid(), c.werr, c.diag())
		}
	}
	execs.Wait()
	deadline := time.Now().Add(3 * time.Second)
	for {
		time.Sleep(10 * time.Millisecond)
		if err := owner.Reconcile(); err != nil {
			t.Error(err)
		}
		busy := false
		for _, r := range rs {
			if n, _ := owner.Users(r.id); n != 0 {
				busy = true
			}
		}
		if !busy || time.Now().After(deadline) {
			break
		}
	}
	for _, r := range rs {
		if n, err := owner.Users(r.id); n != 0 || err != nil {
			t.Errorf("resource %v: %d users, %v, after every lease ended", r.id, n, err)
		}
		noTickets(t, owner, r.id)
	}
	other := open()
	for _, r := range rs {
		wholeAgain(t, other, r.id, capacity, func(l Lease) bool { return accept(r, l) })
	}
	execs.Wait()
	t.Logf("%d accepted, %d refused", accepted.Load(), refused.Load())
}
