package orbitpool

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// Options configures one process's membership of a pool.
type Options struct {
	// Incarnation identifies this life of the process. Default: a random
	// nonzero value.
	Incarnation Incarnation
	// ReconcileInterval is how often the process checks for dead siblings
	// and ages its unaccepted reservations. Default 250ms.
	ReconcileInterval time.Duration
	// ReservationTimeout is how long a reservation on one of this process's
	// resources may stay unaccepted before the owner drops it. Default 1s.
	ReservationTimeout time.Duration
	// OnReclaim, if set, is told about each dead process whose lane this
	// process reclaimed, for logging. It runs on the dispatcher goroutine
	// and must not block.
	OnReclaim func(LaneInfo)
	// OnError, if set, is told about errors met by background housekeeping,
	// which has no caller to return them to. It must not block.
	OnError func(error)
	// Tag is published with this process's lane for its siblings to read
	// (LaneInfo.Tag): for instance which supervisor started it, so that a
	// process can tell a sibling of its own fleet from one of another
	// that names the same segment. The pool gives it no meaning.
	Tag uint64
	// KeepSegment leaves the segment file in place when the last process
	// leaves. By default the last to leave removes it, so that the next
	// fleet starts from an empty table, its counters included; a kept
	// segment carries the counters over, as lifetime totals.
	KeepSegment bool
	// OrderWindow is how many tickets younger than the oldest waiter of the
	// fleet a waiter of this process may be and still be handed a unit
	// that a use of this process's own resources gives back. Keeping such
	// a unit here spares the cross-process wake-ups of handing it to a
	// sibling (and, for a connection, the relay through its owner), at the
	// price of strict order: a waiter can be passed by waiters at most
	// OrderWindow tickets younger than itself. Creation budget has no
	// place to stay, and goes in strict order: a process whose waiters
	// are passed over gets the budget a closed resource gives back, so
	// ownership follows demand. Default 0: strict arrival order.
	OrderWindow uint32
	// ReclaimHold is how long the budget a dead process's resources used
	// stays out of its keys' budgets once this process has reclaimed the
	// dead lane. The kernel closes a dead process's connections at once,
	// but the far end counts each until it has seen the close, and one it
	// was serving a request on until that request is done: budget given
	// back at once lets the fleet open a connection an upstream still
	// counts against a limit of its own. The units are held as resources
	// of this process that no one can use, and go back to the key's
	// waiters when the hold ends; if this process leaves first they go
	// back then, and if it dies, whoever reclaims its lane holds them
	// again. A process joining a fleet whose lanes are all taken, live or
	// dead, reclaims a dead one to take it, and holds nothing of it.
	// What the far end still counts when the hold ends can keep units
	// held longer (see SetLingering). Default 0: the budget goes back at
	// once.
	ReclaimHold time.Duration
}

// Pool is one process's membership of the fleet's pool table: a lane in a
// shared segment, or the whole table in process memory. A *Pool is safe for
// concurrent use; share it rather than opening the segment twice, since each
// Open joins the fleet as another lane.
type Pool struct {
	seg     *segment
	l       *layout
	lane    int
	laneGen uint32
	inc     Incarnation
	opts    Options

	tickets      atomic.Uint32
	closed       atomic.Bool
	guards       atomic.Pointer[guardBatch] // the batch Executions are carved from
	leakedGuards atomic.Uint64

	// laneMu guards this lane's slot allocation and key lists, which only
	// this process writes.
	laneMu sync.Mutex
	free   []int32

	waiters waiterTable
	watches roomWatches

	reconcileMu sync.Mutex
	seen        []seenReservation // ReservationTimeout bookkeeping, per slot and bit

	// withdrawing is held shared by a withdrawal from its closed check to
	// the end of its claim, and exclusively by Close before the lane goes:
	// once the lane is released, a claim of this process reads as a dead
	// one's, which the owner's Reconcile finishes, and a new reservation
	// may take the bit that a late step would then clear.
	withdrawing sync.RWMutex

	// claiming holds the claims this process has under way (see claim).
	// Reconcile cannot tell a sibling's slow claim from a corrupt word, but
	// a claim that names this process's life and is not here is one.
	claiming claimRecord

	heldMu    sync.Mutex
	held      []heldUnit                    // ReclaimHold's units, in the order they end
	lingering atomic.Pointer[func(Key) int] // see SetLingering

	stop     chan struct{}
	finished chan struct{}
}

// Open joins the pool spec names, creating its segment if needed. With an
// empty spec.Path the pool lives in process memory and is the whole fleet.
func Open(spec PoolSpec, opts Options) (*Pool, error) {
	spec = spec.WithDefaults()
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	if opts.ReconcileInterval <= 0 {
		opts.ReconcileInterval = 250 * time.Millisecond
	}
	if opts.ReservationTimeout <= 0 {
		opts.ReservationTimeout = time.Second
	}
	if opts.Incarnation == 0 {
		var b [8]byte
		rand.Read(b[:])
		opts.Incarnation = Incarnation(binary.LittleEndian.Uint64(b[:]) | 1)
	}
	seg, err := openSegment(spec)
	if err != nil {
		return nil, err
	}
	p := &Pool{
		lane:     -1, // until joined: wake-ups from reclaiming on the way in ring every lane
		seg:      seg,
		l:        &seg.l,
		inc:      opts.Incarnation,
		opts:     opts,
		seen:     make([]seenReservation, spec.ResourcesPerLane*PendingReservations),
		stop:     make(chan struct{}),
		finished: make(chan struct{}),
	}
	p.waiters.keys = make(map[int]*keyWaiters)
	err = p.join()
	seg.unlockStructure()
	if err != nil {
		seg.close()
		return nil, err
	}
	if p.opts.ReclaimHold > 0 {
		// The dead lanes join passed over (see join).
		if err := p.Reconcile(); err != nil && p.opts.OnError != nil {
			p.opts.OnError(err)
		}
	}
	// The mapping outlives Close until nothing can touch it: executions and
	// permits hold the Pool, so no late Complete can fault on unmapped memory.
	runtime.AddCleanup(p, func(s *segment) { s.close() }, seg)
	go p.dispatch()
	return p, nil
}

// join takes a free lane. The structure lock is held.
//
// With a ReclaimHold, lanes whose processes died are left for the Reconcile
// that follows, which holds their budget in the lane this process takes
// (reclaimed here, it would go back at once); only if no lane is free is
// the first dead one reclaimed and taken.
func (p *Pool) join() error {
	if p.opts.ReclaimHold > 0 {
		if err := p.joinLane(false); !errors.Is(err, ErrFull) {
			return err
		}
	}
	return p.joinLane(true)
}

// joinLane takes the first free lane, or, if reclaim, the first free or
// dead one, reclaiming the dead lanes it passes.
func (p *Pool) joinLane(reclaim bool) error {
	s := p.seg
	for l := range p.l.nlanes {
		ctl := atomic.LoadUint64(s.u64(s.laneOff(l) + lnCtl))
		if lnState(ctl) == laneLive {
			alive, err := s.laneAlive(l)
			if err != nil {
				return err
			}
			if alive || !reclaim {
				continue
			}
			p.reclaimLane(l)
			p.finishDeadSteps()
		}
		if err := s.holdLane(l); err != nil {
			continue // a process between joining and publishing; not ours
		}
		gen := lnGen(ctl) + 1
		if gen == 0 {
			gen = 1
		}
		// A free lane should hold nothing; make sure of it, since its slots
		// and lists become this process's own.
		p.clearLane(l)
		p.dropReturning(l)
		off := s.laneOff(l)
		atomic.StoreUint64(s.u64(off+lnIncarnation), uint64(p.inc))
		atomic.StoreUint64(s.u64(off+lnPID), uint64(os.Getpid()))
		atomic.StoreUint64(s.u64(off+lnTag), p.opts.Tag)
		now := uint64(time.Now().UnixNano())
		atomic.StoreUint64(s.u64(off+lnStarted), now)
		atomic.StoreUint64(s.u64(off+lnHeartbeat), now)
		atomic.StoreUint32(s.u32(off+lnSleeping), 0)
		atomic.StoreUint64(s.u64(off+lnCtl), laneCtl(gen, laneLive))
		p.lane, p.laneGen = l, gen
		p.free = make([]int32, 0, p.l.perLane)
		for i := p.l.perLane - 1; i >= 0; i-- {
			p.free = append(p.free, int32(i))
		}
		return nil
	}
	return fmt.Errorf("orbitpool: all %d lanes of segment %s are taken by live processes; each process needs a lane of its own, old and new ones overlapping in a reload or upgrade included: stop the fleet and raise PoolSpec.Lanes (the orbit_pool app's processes option; at most %d) in every process: %w", p.l.nlanes, s.path, MaxLanes, ErrFull)
}

// Lane is this process's lane in the segment.
func (p *Pool) Lane() int { return p.lane }

// LaneIncarnation is the incarnation of the process that holds lane now, or
// last held it; 0 for a lane out of range, one never held, or once this
// pool is closed. A lease names its owner's incarnation (Lease.Owner): a
// caller that holds one can tell whether the lane changed hands since.
func (p *Pool) LaneIncarnation(lane int) Incarnation {
	if p.closed.Load() || lane < 0 || lane >= p.l.nlanes {
		return 0
	}
	return Incarnation(atomic.LoadUint64(p.seg.u64(p.seg.laneOff(lane) + lnIncarnation)))
}

// OrderWindow is the pool's Options.OrderWindow: 0 when waiters are served
// in strict ticket order.
func (p *Pool) OrderWindow() uint32 { return p.opts.OrderWindow }

// Incarnation is the life this process joined with.
func (p *Pool) Incarnation() Incarnation { return p.inc }

// Spec is the spec the pool was opened with, defaults applied.
func (p *Pool) Spec() PoolSpec { return p.l.spec }

// Close leaves the fleet: this process's resources, claims, reservations on
// them and waiter registrations are released, and waiters on this pool return
// ErrClosed. Executions still running complete as no-ops.
func (p *Pool) Close() error {
	if !p.closed.CompareAndSwap(false, true) {
		return nil
	}
	close(p.stop)
	p.guards.Store(nil) // its cleanup refers to the pool: let both be collected
	p.ring(p.lane)
	futexWake(p.seg.u32(p.seg.laneOff(p.lane) + lnDoorbell)) // even if the sleeping flag lies
	<-p.finished
	p.waiters.closeAll(p)
	p.watches.closeAll()
	// Wait out the withdrawals under way; later ones see the pool closed.
	p.withdrawing.Lock()
	p.withdrawing.Unlock()
	// A caller's Reconcile may have passed its closed check already: let it
	// finish before the lane goes, for once the lane is released it may be
	// another process's, whose record a late healOwnLane would overwrite.
	// One that takes reconcileMu after this sees the pool closed.
	p.reconcileMu.Lock()
	defer p.reconcileMu.Unlock()
	s := p.seg
	if err := s.lockStructure(); err != nil {
		return err
	}
	p.reclaimLane(p.lane)
	s.releaseLane(p.lane)
	var err error
	if !p.opts.KeepSegment && p.lastMember() {
		err = s.remove()
	}
	s.unlockStructure()
	return err
}

// lastMember reports whether no other process is in the fleet. The structure
// lock is held, so nobody can be joining.
func (p *Pool) lastMember() bool {
	s := p.seg
	for l := range p.l.nlanes {
		if l == p.lane || lnState(atomic.LoadUint64(s.u64(s.laneOff(l)+lnCtl))) != laneLive {
			continue
		}
		if alive, err := s.laneAlive(l); err != nil || alive {
			return false
		}
	}
	return true
}

// rlockOpen takes the structure lock shared for an operation on this lane,
// and refuses once Close has begun. Close marks the pool closed before it
// takes the lock exclusively to release the lane, so an operation that gets
// the lock after the release sees the mark and writes nothing into the lane
// it no longer owns.
func (p *Pool) rlockOpen() error {
	if err := p.seg.rlockStructure(); err != nil {
		return err
	}
	if p.closed.Load() {
		p.seg.runlockStructure()
		return ErrClosed
	}
	return nil
}

// reclaimLane frees every slot of lane l and everything that lane held on keys,
// and wakes the waiters that freed capacity concerns. It is called with the
// structure lock held exclusively, for a lane whose process is dead or
// leaving.
func (p *Pool) reclaimLane(l int) {
	pid := int(atomic.LoadUint64(p.seg.u64(p.seg.laneOff(l) + lnPID)))
	cleared := p.clearLane(l)
	if l != p.lane {
		p.hold(cleared, pid)
	}
	p.recount(cleared)
	// Last, so that whoever sees the lane gone also sees its units back.
	off := p.seg.laneOff(l)
	ctl := atomic.LoadUint64(p.seg.u64(off + lnCtl))
	atomic.StoreUint64(p.seg.u64(off+lnCtl), laneCtl(lnGen(ctl), laneFree))
}

// clearLane frees every slot of lane l and drops its key lists and waiter
// registrations. It returns how many resources and creations of each key
// entry it freed (counting only slots of the entry's present life), for
// recount. A free slot's returning mark is left for recount. The structure
// lock is held exclusively.
func (p *Pool) clearLane(l int) (cleared []int) {
	s := p.seg
	cleared = make([]int, p.l.nkeys)
	for i := range p.l.perLane {
		off := s.slotOff(l, i)
		for {
			w := atomic.LoadUint64(s.u64(off + slWord))
			if wState(w) == StateFree {
				break
			}
			if atomic.CompareAndSwapUint64(s.u64(off+slWord), w, slotWord(nextGen(wGen(w)), StateFree, 0, 0)) {
				for b := range PendingReservations {
					atomic.StoreUint64(s.u64(off+slTickets+8*b), 0)
				}
				if st := wState(w); st == StateCreating || st == StateLive {
					if k, kg, ok := p.slotKey(off); ok && kGen(atomic.LoadUint64(s.u64(s.keyOff(k)+kfCtl))) == kg {
						cleared[k]++
					}
				}
				break
			}
		}
	}
	// Units handed to the lane's waiters go to the waiters of other lanes:
	// those not yet delivered (its queue word counts them), and those
	// delivered to goroutines that may not have taken them, at most one
	// per waiter it had (its wait count); plus the one its oldest waiter
	// may have been about to find. More than were there costs a look that
	// finds nothing.
	type regrant struct {
		k int
		n uint64
	}
	var regrants []regrant
	for k := range p.l.nkeys {
		atomic.StoreUint32(s.u32(s.headOff(l, k)), 0)
		waiters := uint64(min(atomic.SwapUint32(s.u32(s.waitOff(l, k)), 0), 1<<16))
		atomic.AndUint64(s.u64(s.maskOff(k, l)), ^laneBit(l))
		atomic.AndUint64(s.u64(s.roomOff(k, l)), ^laneBit(l))
		atomic.AndUint64(s.u64(s.watchOff(k, l)), ^laneBit(l))
		q := atomic.SwapUint64(s.u64(s.queueOff(l, k)), 0)
		atomic.StoreUint64(s.u64(s.queueOff(l, k)+8), 0)
		atomic.StoreUint64(s.u64(s.queueOff(l, k)+qHeldOff), 0)
		if n := uint64(qGrants(q)) + waiters; n > 0 || qWaiting(q) > 0 {
			regrants = append(regrants, regrant{k, n + 1})
		}
	}
	for _, r := range regrants {
		p.wake(r.k, r.n)
	}
	return cleared
}

// countReturning adds lane l's returning marks (see slReturning), its free
// slots' and its counts', to returning, under the key entry each names,
// unless the entry has since gone to another key. The structure lock is held
// exclusively, so no live process is between giving a unit back and waking
// the waiters for it: every mark found is a dead process's.
func (p *Pool) countReturning(l int, returning []int) (found bool) {
	s := p.seg
	for i := range p.l.perLane {
		off := s.slotOff(l, i)
		w := atomic.LoadUint64(s.u64(off + slWord))
		if wState(w) != StateFree || w&slReturning == 0 {
			continue
		}
		found = true
		if k, kg, ok := p.slotKey(off); ok && kGen(atomic.LoadUint64(s.u64(s.keyOff(k)+kfCtl))) == kg {
			returning[k]++
		}
	}
	for k := range p.l.nkeys {
		if n := atomic.LoadUint32(s.u32(s.returningOff(l, k))); n != 0 {
			found = true
			returning[k] += int(min(n, 1<<16))
		}
	}
	return found
}

// dropReturning clears lane l's returning marks. The structure lock is held
// exclusively.
func (p *Pool) dropReturning(l int) {
	s := p.seg
	for i := range p.l.perLane {
		off := s.slotOff(l, i)
		w := atomic.LoadUint64(s.u64(off + slWord))
		if wState(w) == StateFree && w&slReturning != 0 {
			atomic.CompareAndSwapUint64(s.u64(off+slWord), w, w&^slReturning)
		}
	}
	for k := range p.l.nkeys {
		atomic.StoreUint32(s.u32(s.returningOff(l, k)), 0)
	}
}

// recount sets every key's counters from the slots that hold it. A process
// killed between changing a key's counters and the slot that goes with them
// leaves them disagreeing; the slots are the truth. It runs with the
// structure lock held exclusively, so no live process is half-way through
// such a change, and wakes the keys that got units back.
//
// A process killed after giving a unit back to a key's counters and before
// waking the key's waiters for it leaves the counters right, and a
// returning mark (see slReturning): the units the counters give back are
// then not all the units to wake for. cleared is how many resources and
// creations of each key the lane being reclaimed held (nil for none): the
// counters counted them, and every unit counted beyond them and the slots
// was given back by a dead process half-way through an operation. Each mark
// is a unit given back, either before the counters were told (and so among
// those) or after (and so not): a key is woken for at least its cleared
// units plus its marks. That wakes for exactly the units given back, unless
// a dead process also left a creation claim counted that never took a slot
// (then it may wake for fewer, as before the marks), or was killed after
// its wake-up and before clearing its mark (then for one more). The marks
// are dropped after the wake-ups: a reclaimer killed between the two has the
// next reclaim wake for them again, a unit too many rather than a waiter
// left asleep.
func (p *Pool) recount(cleared []int) {
	s := p.seg
	type count struct{ total, creating int }
	counts := make([]count, p.l.nkeys)
	returning := make([]int, p.l.nkeys)
	var marked []int // lanes with returning marks
	for l := range p.l.nlanes {
		// A lane that is not live holds nothing, whatever its slots say.
		if lnState(atomic.LoadUint64(s.u64(s.laneOff(l)+lnCtl))) != laneLive {
			continue
		}
		// Taken from every lane with the counters, whose units those
		// marks go with, and dropped once they are woken for: a dead
		// lane reclaimed later has none left to wake for twice, and a
		// reclaimer that dies before its wake-ups leaves them all.
		if p.countReturning(l, returning) {
			marked = append(marked, l)
		}
		for i := range p.l.perLane {
			off := s.slotOff(l, i)
			st := wState(atomic.LoadUint64(s.u64(off + slWord)))
			if st != StateCreating && st != StateLive {
				continue
			}
			k, kg, ok := p.slotKey(off)
			if !ok || kGen(atomic.LoadUint64(s.u64(s.keyOff(k)+kfCtl))) != kg {
				continue
			}
			counts[k].total++
			if st == StateCreating {
				counts[k].creating++
			}
		}
	}
	for k, c := range counts {
		ctl := s.u64(s.keyOff(k) + kfCtl)
		old := atomic.LoadUint64(ctl)
		if kState(old) != keyLive {
			continue
		}
		atomic.StoreUint64(ctl, keyCtl(kGen(old), keyLive)|uint64(c.total)<<kTotalShift|uint64(c.creating))
		// A creation claim freed is a unit of the budget and of the
		// concurrent creations at once: one waiter's worth, not two.
		freed := max(kTotal(old)-c.total, kCreating(old)-c.creating)
		if r := returning[k]; r > 0 {
			if cleared != nil {
				r += cleared[k]
			}
			freed = max(freed, r)
		}
		if freed > 0 {
			p.wake(k, uint64(freed))
		}
	}
	for _, l := range marked {
		p.dropReturning(l)
	}
}

// finishDeadSteps puts right what a process killed between two steps of an
// operation left that recount does not: counters it already set right, but
// the hints that go with them it never wrote. The structure lock is held
// exclusively, so no live process is half-way through such a step, and
// every hint it restores costs at most a look that finds nothing:
//   - a room bit cleared by a scanner killed before its second look, or
//     never set by a process killed after giving back a unit of a resource:
//     each lane with room on a key gets its bit;
//   - a unit of a resource given back by a process killed before it woke
//     the key's waiters: a key with waiters and room on its resources, and
//     no units on their way to its waiters, has that room handed out, in
//     ticket order as ever.
//
// A unit of a key's budget given back (by Unregister, or a creation permit's
// Close) by a process killed before its wake-up is not found here, where
// whether a waiter may use it cannot be told (that depends on the Limits it
// waits under, which only it knows): the mark the process left on its way
// has recount wake the key's waiters for it, in ticket order.
func (p *Pool) finishDeadSteps() {
	s := p.seg
	room := make(map[int]uint64)
	for l := range p.l.nlanes {
		if lnState(atomic.LoadUint64(s.u64(s.laneOff(l)+lnCtl))) != laneLive {
			continue
		}
		for i := range p.l.perLane {
			off := s.slotOff(l, i)
			w := atomic.LoadUint64(s.u64(off + slWord))
			free := s.capacity(off) - wUse(w) - wPendN(w)
			if wState(w) != StateLive || free <= 0 {
				continue
			}
			if k, kg, ok := p.slotKey(off); ok && kGen(atomic.LoadUint64(s.u64(s.keyOff(k)+kfCtl))) == kg {
				p.setRoom(l, k, false) // a dead process's unit, on any lane
				room[k] += uint64(free)
			}
		}
	}
	for k, n := range room {
		if p.queued(k) && !p.granting(k) {
			p.wake(k, n)
		}
	}
}

// granting reports whether units of key k are on their way to waiters: not
// yet delivered to a lane's waiters, or unclaimed.
func (p *Pool) granting(k int) bool {
	s := p.seg
	if atomic.LoadUint64(s.u64(s.keyOff(k)+kfUnclaimed)) != 0 {
		return true
	}
	for l := range p.l.nlanes {
		if qGrants(atomic.LoadUint64(s.u64(s.queueOff(l, k)))) != 0 {
			return true
		}
	}
	return false
}

// slotKey reads which key a slot belongs to, bounds-checked.
func (p *Pool) slotKey(off int) (k int, gen uint32, ok bool) {
	meta := atomic.LoadUint64(p.seg.u64(off + slMeta))
	k, gen = int(uint32(meta)), uint32(meta>>32)&kGenMask
	return k, gen, k < p.l.nkeys
}

// ring tells lane l that capacity it waits for may have come back.
func (p *Pool) ring(l int) {
	s := p.seg
	off := s.laneOff(l)
	atomic.AddUint32(s.u32(off+lnDoorbell), 1)
	if atomic.LoadUint32(s.u32(off+lnSleeping)) != 0 {
		futexWake(s.u32(off + lnDoorbell))
	}
}

// wake hands n units of capacity returned on key k to the oldest waiters of
// the fleet: for each unit, it adds a grant to the queue word of the lane
// whose next waiter to be granted is the oldest of all (see laneNext), and
// rings the lanes it gave grants to. Its caller has already made the capacity
// visible, and a waiter publishes itself before it checks for capacity, so
// when no lane has a waiter left to grant, nobody can be left asleep: units
// with no one to take them are simply left for whoever comes.
func (p *Pool) wake(k int, n uint64) { p.wakeToward(k, n, -1) }

// wakeToward is wake with the units going to lane prefer's waiters within
// the order window (see grant); -1 prefers none.
func (p *Pool) wakeToward(k int, n uint64, prefer int) {
	if n == 0 || !p.queued(k) {
		return
	}
	p.grant(k, n, prefer)
}

// grant is wake's work once the key has waiters. prefer is the lane the
// order window may give the units to rather than the fleet's oldest waiter,
// -1 for none: this process's own lane for room on its own resources, which
// can then stay here, or the lane UnregisterToward names. The others
// (creation budget, grants passed on) go in strict order.
func (p *Pool) grant(k int, n uint64, prefer int) (here bool) {
	var rung [MaxLanes / 64]uint64
	if n, here = p.grantLanes(k, n, prefer, &rung); n > 0 {
		// No waiter to hand these to: every one the scan saw has a unit
		// on its way. A waiter that published itself since may have
		// deferred to those; it finds these as unclaimed, or the scan
		// below finds it.
		unclaimed := p.seg.u64(p.seg.keyOff(k) + kfUnclaimed)
		atomic.AddUint64(unclaimed, n)
		for range 4 {
			u := atomic.LoadUint64(unclaimed)
			if u == 0 || !atomic.CompareAndSwapUint64(unclaimed, u, u-1) {
				break
			}
			left, h := p.grantLanes(k, 1, -1, &rung)
			here = here || h
			if left != 0 {
				atomic.AddUint64(unclaimed, 1)
				break
			}
		}
	}
	for i, m := range rung[:p.l.maskWords] {
		for ; m != 0; m &= m - 1 {
			p.ring(i*64 + trailingZeros(m))
		}
	}
	return here
}

// grantLanes adds up to n grants to the lanes of key k, each to the lane
// whose next waiter is the oldest (or to lane prefer's, within the order
// window), delivers this lane's, marks the other lanes in rung, and returns
// how many it could not give and whether it delivered any here.
func (p *Pool) grantLanes(k int, n uint64, prefer int, rung *[MaxLanes / 64]uint64) (left uint64, here bool) {
	s := p.seg
	base := s.keyOff(k) + kfMasks
	for fails := 0; n > 0 && fails < 4*p.l.nlanes+8; {
		best, bq, bt := -1, uint64(0), uint32(0)
		pref, pq, pt := false, uint64(0), uint32(0)
		for i := range p.l.maskWords {
			for m := atomic.LoadUint64(s.u64(base + 8*i)); m != 0; m &= m - 1 {
				l := i*64 + trailingZeros(m)
				if l >= p.l.nlanes {
					continue
				}
				t, q, ok := s.laneNext(l, k)
				if !ok || qGrants(q) == qGrantMask {
					continue
				}
				if l == prefer {
					pref, pq, pt = true, q, t
				}
				if best < 0 || ticketBefore(t, bt) {
					best, bq, bt = l, q, t
				}
			}
		}
		if best < 0 {
			break
		}
		// Past its second undelivered grant, laneNext names a lane's
		// third waiter, not the one the grant is for (siblings' grants
		// to this lane wait for its dispatcher).
		if pref && best != prefer && qGrants(pq) <= 2 && pt-bt <= p.opts.OrderWindow {
			// The preferred lane's waiter is close enough behind: for
			// this process's own lane, the unit stays here, sparing two
			// processes a wake-up each.
			best, bq = prefer, pq
		}
		if !atomic.CompareAndSwapUint64(s.u64(s.queueOff(best, k)), bq, bq+1) {
			fails++
			continue
		}
		n--
		// Delivered at once, so that this lane's word names its next
		// waiter exactly for the units still to hand out; unless this
		// pool is closed, and the lane may be another process's by now,
		// whose dispatcher delivers it.
		if best == p.lane && p.waiters.deliver(p, k) {
			here = true
		} else {
			rung[best>>6] |= laneBit(best)
		}
	}
	return n, here
}

// unitBack is setRoom and wake for one unit of this lane's, the hot path of
// Complete: with at most 64 lanes, the masks are one word each of one line. It
// reports whether the unit went to a waiter of this process.
func (p *Pool) unitBack(k int) (handed bool) {
	if p.l.maskWords != 1 {
		p.setRoom(p.lane, k, true)
		return p.queued(k) && p.grant(k, 1, p.lane)
	}
	off := p.seg.keyOff(k) + kfMasks
	room, bit := p.seg.u64(off+8), laneBit(p.lane)
	if atomic.LoadUint64(room)&bit == 0 {
		atomic.OrUint64(room, bit)
	}
	if atomic.LoadUint64(p.seg.u64(off+16)) != 0 { // the watch mask
		p.roomCame(p.lane, k, true)
	}
	return atomic.LoadUint64(p.seg.u64(off)) != 0 && p.grant(k, 1, p.lane)
}

// setRoom notes that lane l may have room on a resource of key k, for
// siblings looking for one (see roomCandidates). The capacity is visible
// already, so a sibling clearing the bit meanwhile finds it when it checks
// again. own is roomCame's: this process's own use made the room.
func (p *Pool) setRoom(l, k int, own bool) {
	w := p.seg.u64(p.seg.roomOff(k, l))
	if atomic.LoadUint64(w)&laneBit(l) == 0 {
		atomic.OrUint64(w, laneBit(l))
	}
	p.roomCame(l, k, own)
}

// dispatch is the one goroutine per process that sleeps on the lane's
// doorbell, hands wake-ups to waiting goroutines and runs Reconcile.
func (p *Pool) dispatch() {
	defer close(p.finished)
	s := p.seg
	off := s.laneOff(p.lane)
	bell, sleeping := s.u32(off+lnDoorbell), s.u32(off+lnSleeping)
	next := time.Now().Add(p.opts.ReconcileInterval)
	for {
		seen := atomic.LoadUint32(bell)
		select {
		case <-p.stop:
			return
		default:
		}
		p.watches.deliver(p)
		if p.waiters.deliverAll(p) {
			// Let the goroutines just woken run on this thread now,
			// rather than after another thread is woken to run them
			// while this one blocks in the futex.
			runtime.Gosched()
		}
		now := time.Now()
		if !now.Before(next) {
			if err := p.Reconcile(); err != nil && p.opts.OnError != nil {
				p.opts.OnError(err)
			}
			next = now.Add(p.opts.ReconcileInterval)
		}
		wake := next
		if h := p.releaseHeld(now); !h.IsZero() && h.Before(wake) {
			wake = h
		}
		wait := time.Until(wake)
		if wait <= 0 {
			continue // a zero timeout would mean sleeping with no limit
		}
		atomic.StoreUint32(sleeping, 1)
		if atomic.LoadUint32(bell) == seen {
			futexWait(bell, seen, wait)
		}
		atomic.StoreUint32(sleeping, 0)
	}
}
