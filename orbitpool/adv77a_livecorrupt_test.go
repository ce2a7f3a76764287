package orbitpool

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// adv77aBound is how long any one operation may take under corruption.
const adv77aBound = 2 * time.Second

// adv77aBeyond is the bits of mask word i that name lanes past nl.
func adv77aBeyond(nl, i int) uint64 {
	if n := nl - 64*i; n < 64 {
		return ^uint64(1<<n - 1)
	}
	return 0
}

// adv77aVictimWord overwrites one word of the victim key's entry, of the
// lanes' per-key words for it, or of one of its resources' slots, with a
// hostile value, and says what it did.
func adv77aVictimWord(rng *rand.Rand, s *segment, k int, slots []ResourceID, live []*Pool) string {
	nl := s.l.nlanes
	lane := rng.IntN(nl)
	claimOf := func() uint64 {
		switch rng.IntN(5) {
		case 0: // a live lane's claim, in its present life
			p := live[rng.IntN(len(live))]
			return makeTicket(p.lane, p.laneGen, rng.Uint32()) | claimFlag
		case 1: // a live lane's, of another life
			p := live[rng.IntN(len(live))]
			return makeTicket(p.lane, p.laneGen+1+rng.Uint32N(100), rng.Uint32()) | claimFlag
		case 2: // a lane that does not exist
			return makeTicket(nl+rng.IntN(256-nl), rng.Uint32(), rng.Uint32()) | claimFlag
		case 3: // a free lane's
			return makeTicket(nl-1, rng.Uint32(), rng.Uint32()) | claimFlag
		default:
			return rng.Uint64()
		}
	}
	id := slots[rng.IntN(len(slots))]
	soff := s.slotOff(id.Lane(), id.Slot())
	put64 := func(off int, v uint64, what string) string {
		old := atomic.SwapUint64(s.u64(off), v)
		return fmt.Sprintf("%s %#x -> %#x", what, old, v)
	}
	put32 := func(off int, v uint32, what string) string {
		old := atomic.SwapUint32(s.u32(off), v)
		return fmt.Sprintf("%s %#x -> %#x", what, old, v)
	}
	switch rng.IntN(14) {
	case 0, 1:
		b := rng.IntN(PendingReservations)
		return put64(soff+slTickets+8*b, claimOf(), fmt.Sprintf("slot %v ticket %d", id, b))
	case 2: // pending bits nobody stamped
		w := s.u64(soff + slWord)
		add := rng.Uint64() & pendMask
		atomic.OrUint64(w, add)
		return fmt.Sprintf("slot %v pending |= %#x", id, add)
	case 3: // a key index out of range, or of a life the entry never had
		meta := uint64(s.l.nkeys+rng.IntN(1<<20)) | uint64(rng.Uint32()&0xffffff)<<32
		if rng.IntN(2) == 0 {
			meta = uint64(k) | uint64(rng.Uint32()&0xffffff)<<32
		}
		return put64(soff+slMeta, meta, fmt.Sprintf("slot %v meta", id))
	case 4: // watch mask with lanes that do not exist
		i := rng.IntN(s.l.maskWords)
		return put64(s.watchOff(k, 64*i), rng.Uint64()|adv77aBeyond(nl, i), fmt.Sprintf("watch mask word %d", i))
	case 5: // room mask with lanes that do not exist
		i := rng.IntN(s.l.maskWords)
		return put64(s.roomOff(k, 64*i), rng.Uint64()|adv77aBeyond(nl, i), fmt.Sprintf("room mask word %d", i))
	case 6: // waiter mask with lanes that do not exist
		i := rng.IntN(s.l.maskWords)
		return put64(s.maskOff(k, 64*i), rng.Uint64()|adv77aBeyond(nl, i), fmt.Sprintf("waiter mask word %d", i))
	case 7:
		return put64(s.keyOff(k)+kfRoomSeq, rng.Uint64(), "room sequence")
	case 8:
		return put64(s.keyOff(k)+kfUnclaimed, rng.Uint64(), "unclaimed count")
	case 9:
		return put64(s.keyOff(k)+kfTicket, rng.Uint64(), "key ticket counter")
	case 10:
		i := rng.IntN(3)
		return put64(s.queueOff(lane, k)+8*i, rng.Uint64(), fmt.Sprintf("queue %d word %d", lane, i))
	case 11:
		return put32(s.waitOff(lane, k), rng.Uint32(), fmt.Sprintf("wait count %d", lane))
	case 12:
		return put32(s.headOff(lane, k), rng.Uint32N(uint32(s.l.perLane)*3), fmt.Sprintf("head %d", lane))
	default:
		return put32(soff+slNext, rng.Uint32(), fmt.Sprintf("slot %v next", id))
	}
}

// TestAdv77aLiveCorruptionOfOneKey: two pools of a segment run Reserve,
// Accept, Withdraw, Acquire (local and remote), Watch, WatchRoom/Rearm,
// Neediest and Reconcile on three good keys and on a victim key, while a
// corrupter overwrites, live, the victim's words: its resources' tickets
// (claims of live lanes, of other lives, of lanes that do not exist), their
// pending bits, key indices and list links, its watch, room and waiter
// masks with bits of lanes that do not exist, its room sequence, unclaimed
// count and ticket counter, and every lane's queue words, wait count and
// list head for it. No call may panic or take longer than adv77aBound; a
// victim's operation fails only with ErrBusy, ErrStale, ErrCorrupt, ErrFull,
// ErrBudget or its context's end; and afterwards the good keys serve their
// whole capacity, with no ticket or claim left on their resources.
//
// A child process runs Reserve (handing leases to this process), Withdraw,
// Acquire, WatchRoom and Reconcile on the same keys meanwhile, under the
// same bounds, and must leave cleanly.
func TestAdv77aLiveCorruptionOfOneKey(t *testing.T) { adv77aLiveCorruption(t, 4, false) }

// TestAdv77aLiveCorruptionWideMasks is TestAdv77aLiveCorruptionOfOneKey
// with 70 lanes: a key's masks take two words, the second naming lanes
// 64..127, of which 70..127 do not exist.
func TestAdv77aLiveCorruptionWideMasks(t *testing.T) { adv77aLiveCorruption(t, 70, false) }

// TestAdv77aLiveCorruptionChildKilled is TestAdv77aLiveCorruptionOfOneKey
// with the child, which owns a resource of the victim key and one of a
// good key, SIGKILLed at the end instead of stopped, and the pools holding
// a dead process's units for 100ms (Options.ReclaimHold): reclaiming its
// lane over the corrupted words returns within adv77aBound, and once the
// hold ends the good key's budget is recounted to the resources left (a
// creation fits within one more than those, not within them).
func TestAdv77aLiveCorruptionChildKilled(t *testing.T) { adv77aLiveCorruption(t, 4, true) }

// adv77aGood0 is the first good key of adv77aLiveCorruption.
var adv77aGood0 = Key{0xa77a, 100}

func adv77aLiveCorruption(t *testing.T, lanes int, kill bool) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	spec := PoolSpec{Lanes: lanes, Keys: 8, ResourcesPerLane: 8, Path: filepath.Join(t.TempDir(), "seg")}
	opts := Options{ReconcileInterval: 2 * time.Millisecond, ReservationTimeout: 20 * time.Millisecond}
	if kill {
		opts.ReclaimHold = 100 * time.Millisecond
	}
	a := adv77aOpen(t, spec, opts)
	b := adv77aOpen(t, spec, opts)
	pools := []*Pool{a, b}
	byLane := map[int]*Pool{a.lane: a, b.lane: b}
	good := []Key{adv77aGood0, {0xa77a, 101}, {0xa77a, 102}}
	victim := Key{0xa77a, 199}
	type res struct {
		id    ResourceID
		owner *Pool
		cap   int
	}
	var goodRes, victimRes []res
	reg := func(p *Pool, k Key, c int) res {
		id, err := p.Register(k, c)
		if err != nil {
			t.Fatal(err)
		}
		return res{id, p, c}
	}
	goodRes = append(goodRes, reg(a, good[0], 2), reg(a, good[0], 2), reg(b, good[1], 2), reg(b, good[2], 1), reg(a, good[2], 1))
	victimRes = append(victimRes, reg(a, victim, 2), reg(a, victim, 2), reg(b, victim, 1))
	vref, ok := a.lookupKey(victim)
	if !ok {
		t.Fatal("victim key not found")
	}
	var vids []ResourceID
	for _, r := range victimRes {
		vids = append(vids, r.id)
	}
	// The child: victim resources first, then the good ones.
	cids := append([]ResourceID(nil), vids...)
	for _, r := range goodRes {
		cids = append(cids, r.id)
	}
	child := mpStart(t, "adv77a-churner", mpArgs{Spec: spec, Reconcile: opts.ReconcileInterval, ResTimeout: opts.ReservationTimeout, IDs: cids, N: len(vids), Key: victim, Seed: seed, Lifetime: 40 * time.Second})
	live := append([]*Pool(nil), a, b)
	child.expect("ready", 10*time.Second)
	var fromChild atomic.Int64
	var childLeases sync.WaitGroup
	childLeases.Add(1)
	go func() {
		defer childLeases.Done()
		for m := range child.msgs {
			switch m.Type {
			case "lease":
				var l Lease
				if err := l.UnmarshalBinary(m.Lease); err != nil {
					t.Errorf("lease from the child: %v", err)
					continue
				}
				fromChild.Add(1)
				o := byLane[l.ID.Lane()]
				if o == nil {
					t.Errorf("the child sent a lease on %v, of no pool here", l.ID)
					continue
				}
				start := time.Now()
				e, err := o.Accept(l)
				if d := time.Since(start); d > adv77aBound {
					t.Errorf("Accept of a child's lease took %v", d)
				}
				if err == nil {
					e.Complete()
				} else if !errors.Is(err, ErrStale) && !errors.Is(err, ErrCorrupt) {
					t.Errorf("Accept of a child's lease: %v", err)
				}
			case "error":
				t.Errorf("child: %s", m.Err)
			case "bye":
				return
			default:
				t.Errorf("child sent %+v", m)
			}
		}
	}()

	var slowest atomic.Int64
	timed := func(what string, f func() error, victimOp bool) {
		start := time.Now()
		err := f()
		d := time.Since(start)
		if int64(d) > slowest.Load() {
			slowest.Store(int64(d))
		}
		if d > adv77aBound {
			t.Errorf("%s took %v", what, d)
		}
		if err == nil || errors.Is(err, ErrBusy) || errors.Is(err, context.DeadlineExceeded) {
			return
		}
		if victimOp && (errors.Is(err, ErrStale) || errors.Is(err, ErrCorrupt) || errors.Is(err, ErrFull) || errors.Is(err, ErrBudget)) {
			return
		}
		if !victimOp && errors.Is(err, ErrStale) {
			return // a reservation aged out under load
		}
		t.Errorf("%s: %v", what, err)
	}
	finishPlan := func(plan Plan) {
		switch {
		case plan.Execution != nil:
			plan.Execution.Complete()
		case plan.Permit != nil:
			plan.Permit.Close()
		case plan.Lease.Ticket != 0:
			if o := byLane[plan.Lease.ID.Lane()]; o != nil {
				if e, err := o.Accept(plan.Lease); err == nil {
					e.Complete()
					return
				}
			}
			pools[0].Withdraw(plan.Lease)
		}
	}

	stop := make(chan struct{})
	stopped := func() bool {
		select {
		case <-stop:
			return true
		default:
			return false
		}
	}
	var wg sync.WaitGroup
	worker := func(f func(rng *rand.Rand)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, rand.Uint64()))
			for !stopped() {
				f(rng)
			}
		}()
	}
	// Reserve / Accept / Withdraw, good and victim, across the two lanes.
	for range 2 {
		worker(func(rng *rand.Rand) {
			isVictim := rng.IntN(2) == 0
			rs := goodRes
			if isVictim {
				rs = victimRes
			}
			r := rs[rng.IntN(len(rs))]
			reserver := pools[rng.IntN(2)]
			var l Lease
			timed("Reserve", func() (err error) { l, err = reserver.Reserve(r.id); return }, isVictim)
			if l.Ticket == 0 {
				time.Sleep(50 * time.Microsecond)
				return
			}
			if rng.IntN(4) == 0 {
				timed("Withdraw", func() error { reserver.Withdraw(l); return nil }, isVictim)
				return
			}
			var e *Execution
			timed("Accept", func() (err error) { e, err = r.owner.Accept(l); return }, isVictim)
			if e == nil {
				reserver.Withdraw(l)
				return
			}
			time.Sleep(time.Duration(rng.IntN(200)) * time.Microsecond)
			timed("Complete", func() error { e.Complete(); return nil }, isVictim)
		})
	}
	// Acquire, with a short deadline, on every key.
	for _, p := range pools {
		worker(func(rng *rand.Rand) {
			isVictim := rng.IntN(2) == 0
			k := good[rng.IntN(len(good))]
			if isVictim {
				k = victim
			}
			var policy Policy = LocalFirst{}
			if rng.IntN(3) == 0 {
				policy = LocalOnly{}
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Duration(1+rng.IntN(20))*time.Millisecond)
			var plan Plan
			timed("Acquire", func() (err error) { plan, err = p.Acquire(ctx, k, policy, Limits{MaxResources: 8}); return }, isVictim)
			cancel()
			time.Sleep(time.Duration(rng.IntN(300)) * time.Microsecond)
			finishPlan(plan)
		})
	}
	// Watches: the waiter queue and the room watch.
	for _, p := range pools {
		worker(func(rng *rand.Rand) {
			isVictim := rng.IntN(2) == 0
			k := good[rng.IntN(len(good))]
			if isVictim {
				k = victim
			}
			if rng.IntN(2) == 0 {
				var rd *Readiness
				timed("Watch", func() (err error) { rd, err = p.Watch(k); return }, isVictim)
				if rd == nil {
					return
				}
				select {
				case <-rd.Ready():
				case <-time.After(time.Duration(rng.IntN(3)) * time.Millisecond):
				}
				timed("Readiness.Close", func() error { rd.Close(); return nil }, isVictim)
				return
			}
			var w *RoomWatch
			timed("WatchRoom", func() (err error) { w, err = p.WatchRoom(k); return }, isVictim)
			if w == nil {
				return
			}
			for range 3 {
				select {
				case <-w.Ready():
					timed("Rearm", func() error { w.Rearm(); return nil }, isVictim)
				case <-time.After(time.Millisecond):
				}
			}
			timed("RoomWatch.Close", func() error { w.Close(); return nil }, isVictim)
		})
	}
	// Housekeeping and advice.
	worker(func(rng *rand.Rand) {
		p := pools[rng.IntN(2)]
		timed("Reconcile", func() error {
			err := p.Reconcile()
			if errors.Is(err, ErrCorrupt) {
				return nil
			}
			return err
		}, true)
		timed("Neediest", func() error { p.Neediest(victim); p.Neediest(good[0]); return nil }, true)
		time.Sleep(200 * time.Microsecond)
	})
	// The corrupter.
	var corrupted atomic.Int64
	var lastCorrupt atomic.Value
	wg.Add(1)
	go func() {
		defer wg.Done()
		rng := rand.New(rand.NewPCG(seed, 77))
		for !stopped() {
			lastCorrupt.Store(adv77aVictimWord(rng, a.seg, vref.idx, vids, live))
			corrupted.Add(1)
			time.Sleep(time.Duration(rng.IntN(300)) * time.Microsecond)
		}
	}()

	time.Sleep(1500 * time.Millisecond)
	close(stop)
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		t.Fatalf("workers still running 10s after the stop (last corruption: %v):\n%s", lastCorrupt.Load(), buf)
	}
	// The child stops, reports, and leaves; or dies, and is reclaimed.
	if kill {
		child.kill()
	} else {
		child.send(mpMsg{Type: "stop"})
	}
	childDone := make(chan struct{})
	go func() { childLeases.Wait(); close(childDone) }()
	select {
	case <-childDone:
	case <-time.After(10 * time.Second):
		t.Fatalf("the child did not stop within 10s%s", child.diag())
	}
	if kill {
		adv77aWithin(t, "reclaiming the killed child's lane", func() {
			if err := a.Reconcile(); err != nil && !errors.Is(err, ErrCorrupt) {
				t.Errorf("Reconcile: %v", err)
			}
		})
		if a.LiveLanes() != 2 {
			t.Errorf("%d live lanes after the child's was reclaimed, want 2", a.LiveLanes())
		}
		var err error
		for end := time.Now().Add(3 * time.Second); ; {
			var cp *CreationPermit
			if cp, err = a.ClaimCreate(adv77aGood0, Limits{MaxResources: 3}); err == nil {
				cp.Close()
				break
			}
			if time.Now().After(end) {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		if err != nil {
			t.Errorf("the good key's budget was not recounted 3s after the child's death: %v", err)
		}
		if cp, err := a.ClaimCreate(adv77aGood0, Limits{MaxResources: 2}); err == nil {
			cp.Close()
			t.Errorf("a creation within 2 resources of the good key, which has 2 left, was granted")
		}
	} else {
		child.finish(10 * time.Second)
	}
	if fromChild.Load() == 0 {
		t.Errorf("the child handed over no lease")
	}
	if corrupted.Load() < 50 {
		t.Errorf("only %d corruptions", corrupted.Load())
	}
	t.Logf("%d corruptions, %d leases from the child, slowest call %v", corrupted.Load(), fromChild.Load(), time.Duration(slowest.Load()))

	// The good keys: every reservation ages or is given back; then each
	// resource takes its whole capacity from the other lane, and serves
	// a local Acquire after.
	deadline := time.Now().Add(5 * time.Second)
	for _, r := range goodRes {
		for {
			r.owner.Reconcile()
			n, err := r.owner.Users(r.id)
			if err != nil {
				t.Fatalf("good resource %v: %v", r.id, err)
			}
			if n == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("good resource %v still has %d users and reservations 5s after the workers stopped", r.id, n)
			}
			time.Sleep(5 * time.Millisecond)
		}
		noTickets(t, r.owner, r.id)
	}
	for _, r := range goodRes {
		other := a
		if r.owner == a {
			other = b
		}
		var es []*Execution
		for i := range r.cap {
			l, err := other.Reserve(r.id)
			if err != nil {
				t.Fatalf("good resource %v: reservation %d of %d: %v", r.id, i+1, r.cap, err)
			}
			e, err := r.owner.Accept(l)
			if err != nil {
				t.Fatalf("good resource %v: Accept %d of %d: %v", r.id, i+1, r.cap, err)
			}
			es = append(es, e)
		}
		if _, err := other.Reserve(r.id); !errors.Is(err, ErrBusy) {
			t.Errorf("good resource %v: a reservation past its capacity %d: %v", r.id, r.cap, err)
		}
		for _, e := range es {
			e.Complete()
		}
	}
	for _, k := range good {
		ctx, cancel := context.WithTimeout(context.Background(), adv77aBound)
		plan, err := b.Acquire(ctx, k, LocalFirst{}, Limits{})
		cancel()
		if err != nil {
			t.Errorf("good key %v: Acquire after the corruption: %v", k, err)
			continue
		}
		finishPlan(plan)
	}
	for _, p := range pools {
		closed := make(chan error, 1)
		go func() { closed <- p.Close() }()
		select {
		case err := <-closed:
			if err != nil {
				t.Errorf("Close: %v", err)
			}
		case <-time.After(adv77aBound):
			t.Fatalf("Close took more than %v", adv77aBound)
		}
	}
}

func init() { mpMoreRoles["adv77a-churner"] = adv77aRoleChurner }

// adv77aRoleChurner runs, until the parent says "stop", two goroutines of
// Reserve (handing the lease to the parent, or withdrawing it), Acquire,
// WatchRoom/Rearm, Watch and Reconcile over c.args.IDs, of which the first
// c.args.N are the victim key c.args.Key's. Every call must return within
// adv77aBound, and fail only as adv77aLiveCorruption allows; then it says
// "bye" and closes its pool.
func adv77aRoleChurner(c *mpChildCtx) error {
	p, err := c.open()
	if err != nil {
		return err
	}
	if _, err := p.Register(c.args.Key, 1); err != nil {
		return err
	}
	if _, err := p.Register(adv77aGood0, 1); err != nil {
		return err
	}
	c.send(mpMsg{Type: "ready", Lane: p.lane})
	stop := make(chan struct{})
	var errMu sync.Mutex
	var errs []string
	report := func(format string, args ...any) {
		errMu.Lock()
		defer errMu.Unlock()
		if len(errs) < 10 {
			errs = append(errs, fmt.Sprintf(format, args...))
		}
	}
	timed := func(what string, victim bool, f func() error) {
		start := time.Now()
		err := f()
		if d := time.Since(start); d > adv77aBound {
			report("%s took %v", what, d)
		}
		if err == nil || errors.Is(err, ErrBusy) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrStale) {
			return
		}
		if victim && (errors.Is(err, ErrCorrupt) || errors.Is(err, ErrFull) || errors.Is(err, ErrBudget)) {
			return
		}
		report("%s: %v", what, err)
	}
	var wg sync.WaitGroup
	for g := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(c.args.Seed, uint64(g)))
			for {
				select {
				case <-stop:
					return
				default:
				}
				i := rng.IntN(len(c.args.IDs))
				victim := i < c.args.N
				switch rng.IntN(5) {
				case 0, 1:
					var l Lease
					timed("Reserve", victim, func() (err error) { l, err = p.Reserve(c.args.IDs[i]); return })
					if l.Ticket == 0 {
						time.Sleep(100 * time.Microsecond)
						continue
					}
					if rng.IntN(3) == 0 {
						timed("Withdraw", victim, func() error { p.Withdraw(l); return nil })
						continue
					}
					b, err := l.MarshalBinary()
					if err != nil {
						report("marshal: %v", err)
						continue
					}
					c.send(mpMsg{Type: "lease", Lease: b})
				case 2:
					ctx, cancel := context.WithTimeout(context.Background(), time.Duration(1+rng.IntN(10))*time.Millisecond)
					var plan Plan
					timed("Acquire", true, func() (err error) {
						plan, err = p.Acquire(ctx, c.args.Key, LocalFirst{}, Limits{MaxResources: 8})
						return
					})
					cancel()
					switch {
					case plan.Execution != nil:
						plan.Execution.Complete()
					case plan.Permit != nil:
						plan.Permit.Close()
					case plan.Lease.Ticket != 0:
						p.Withdraw(plan.Lease)
					}
				case 3:
					var w *RoomWatch
					timed("WatchRoom", true, func() (err error) { w, err = p.WatchRoom(c.args.Key); return })
					if w != nil {
						select {
						case <-w.Ready():
							timed("Rearm", true, func() error { w.Rearm(); return nil })
						case <-time.After(time.Millisecond):
						}
						timed("RoomWatch.Close", true, func() error { w.Close(); return nil })
					}
					var rd *Readiness
					timed("Watch", true, func() (err error) { rd, err = p.Watch(c.args.Key); return })
					if rd != nil {
						select {
						case <-rd.Ready():
						case <-time.After(time.Millisecond):
						}
						timed("Readiness.Close", true, func() error { rd.Close(); return nil })
					}
				default:
					timed("Reconcile", true, func() error {
						if err := p.Reconcile(); err != nil && !errors.Is(err, ErrCorrupt) {
							return err
						}
						return nil
					})
					timed("Neediest", true, func() error { p.Neediest(c.args.Key); return nil })
				}
			}
		}()
	}
	if _, err := c.expect("stop"); err != nil {
		close(stop)
		wg.Wait()
		return err
	}
	close(stop)
	wg.Wait()
	if len(errs) > 0 {
		c.send(mpMsg{Type: "error", Err: strings.Join(errs, "; ")})
	}
	c.send(mpMsg{Type: "bye"})
	c.untilParentLeaves()
	return p.Close()
}
