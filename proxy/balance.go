package proxy

import (
	"context"
	"time"

	"github.com/orbitproxy/orbit/orbitpool"
	"go.uber.org/zap"
)

// Under a cap, which process owns a key's connections is settled by which
// dialed first when the fleet started, and nothing moved them after: in the
// capped demo one worker came to own all 16 of them and relayed three
// requests in four for its siblings, at 0.86 times stock's rate. With an
// order window a connection that comes free stays with its owner's waiters,
// so a worker that owns none sends every request through a sibling, at the
// cost of two cross-process wake-ups and a relay each.
//
// So a process looks, every balanceEvery uses of its connections of a key
// at its cap, for the sibling that waits for one while holding the fewest
// (orbitpool.Pool.Neediest). If it holds at least two more than that
// sibling, the connection whose use ended leaves in good order
// (retireToward, so that an upstream enforcing the same cap has let it go
// first), and its unit goes to that sibling's oldest waiter, which dials the
// replacement. A move whose unit reaches that sibling (within the order
// window; otherwise it goes in strict order) lowers the sum of the squares
// of the processes' counts, so moves stop once no waiting sibling holds two
// fewer than another: a cap that does not divide evenly settles as
// [2 1 1], not moving for ever. Each move costs the upstream one connection
// (and for TLS one handshake).
//
// Ownership evens out among the processes that wait; it does not follow
// uneven demand, which no count of connections can tell. In strict order
// (an order window of 0) a unit that comes free goes to the fleet's oldest
// waiter whoever owns it, so where connections live saves no relay, and
// nothing moves.
const balanceEvery = 64

// moveCloseWait bounds how long a connection that moves waits for the
// upstream to close its side. Unlike a retirement by policy (closeWait), a
// move is this module's choice, so it holds the unit until the upstream has
// let the connection go, which an upstream that enforces the same cap needs
// before it accepts the replacement; an upstream that took longer than
// closeWait makes moves too dear, and the key's connections stop moving in
// this process.
const moveCloseWait = 2 * time.Second

// balanceToward counts a use of oc that ended with oc reusable and, once
// per balanceEvery such uses of oc's key (whose record is kc), reports the
// lane oc should leave for (see balanceEvery), or -1 to keep it. One
// connection per key moves at a time: until it has left, and until the
// sibling has dialed its replacement (the key is below its cap meanwhile),
// counts would be stale.
func (n *Node) balanceToward(oc *owned, kc *keyCap) int {
	if !n.balances(kc) {
		return -1
	}
	if kc.uses.Add(1)%balanceEvery != 0 || kc.off.Load() || kc.moving.Load() || int64(n.pool.Live(oc.key)) < kc.max.Load() {
		return -1
	}
	lane, held, own, ok := n.pool.Neediest(oc.key)
	if !ok || own-held < 2 || !kc.moving.CompareAndSwap(false, true) {
		return -1
	}
	n.stats.rebalanced.Add(1)
	return lane
}

// dialToward reports the sibling that should dial the next connection of a
// capped key in this process's place, or -1 to dial here: one that waits for
// the key (within the order window) holding fewer of its connections than
// this process holds and dials. Handing it the unit
// (orbitpool.CreationPermit.CloseToward) settles ownership where a move would
// later, without the connection a move costs the upstream (and for TLS a
// handshake): on a key whose connections are dialed again and again (retired
// by a request limit, closed by the upstream), the process whose request
// waited longest dials each one, and the balancer would move them back.
//
// At a cold start the first process to have requests takes the whole budget
// before any sibling waits, and the balancer then moves most of its
// connections. So a process that holds and dials its share of the cap
// already (the cap over the fleet's processes, rounded up) holds its dial
// back for up to dialHold, looking for such a sibling every dialHoldPoll: the
// unit it holds keeps the siblings' first requests from dialing, so they
// wait, and then take the unit. A hold that finds no sibling by its end
// (the others have no requests for the key) dials here, and no dial is held
// back for dialHoldPause after it: demand that is uneven pays the hold once
// a pause, not on every dial. One that ends sooner because this process is
// no longer past its share (a dial of its own failed, a connection left)
// dials here too, but was not in vain: the next dial past the share holds.
//
// Until a hold of the key has been in vain, holds last coldDialHold rather
// than dialHold: that is the cold start, when the siblings' demand comes in
// over tens of milliseconds. A cold start's demand under a cap of 16 over
// four workers, traced, reached the workers 2, 8 and 26 ms after the first,
// whose holds ended after 10 ms with no sibling waiting: it dialed twice its
// share, and the balancer moved four of them away. Whichever the length, a
// request with a deadline holds for half of the time it has left at most.
//
// A request that passed its dial on before (first false) passes it again
// only while this process is past its share, and never holds it back: a unit
// it passed may have come back to it unused (the sibling's request found a
// connection with room), and dialing it here would undo the pass.
func (n *Node) dialToward(ctx context.Context, kc *keyCap, key orbitpool.Key, first bool) int {
	if !n.balances(kc) {
		kc.dialBegins()
		return -1
	}
	var until int64 // the end of the hold; 0 before it begins
	for {
		now := sinceStart(time.Now())
		mayHold := first && now >= kc.noHoldUntil.Load()
		if until != 0 {
			mayHold = now < until && ctx.Err() == nil
		}
		lane, holding := n.passOrDial(kc, key, first, mayHold)
		switch {
		case lane >= 0:
			n.stats.dialsPassed.Add(1)
			return lane
		case !holding:
			if until != 0 && now >= until {
				kc.noHoldUntil.Store(now + int64(dialHoldPause))
			}
			return -1
		case until == 0:
			hold := kc.holdFor()
			if dl, ok := ctx.Deadline(); ok {
				// Half of what the request has left at most: it
				// still has to dial and be served.
				hold = min(hold, time.Until(dl)/2)
			}
			until = now + int64(hold)
			n.stats.dialsHeld.Add(1)
		}
		time.Sleep(dialHoldPoll)
	}
}

// dialHold bounds dialToward's hold. It is what a process's burst that needs
// more than its share of a capped key, with no sibling wanting any, pays
// once a dialHoldPause. coldDialHold bounds the holds before the first in
// vain: a process's burst with no sibling wanting any pays it once.
var (
	dialHold     = 10 * time.Millisecond
	coldDialHold = 100 * time.Millisecond
)

// holdFor is how long a dial of the key may be held back: coldDialHold until
// a hold has been in vain, and so paused the holds, dialHold after.
func (kc *keyCap) holdFor() time.Duration {
	if kc.noHoldUntil.Load() == 0 {
		return coldDialHold
	}
	return dialHold
}

const (
	dialHoldPoll  = 200 * time.Microsecond
	dialHoldPause = time.Second
	// maxPasses bounds how many times one request passes its dial on,
	// and so how many times it goes back to wait.
	maxPasses = 3
)

// passedDials is what a process knows of the dials it passed to a sibling
// that its pool does not show yet: how many, since the sibling held base
// connections, the last at at (nanoseconds since processStart).
type passedDials struct {
	base, n int
	at      int64
}

// passedFor is how long a pass counts for its sibling before that sibling's
// connections show it: the time of a slow dial. A pass whose dial failed
// then stops counting.
const passedFor = 100 * time.Millisecond

// passOrDial decides, for dialToward, between passing the dial to a sibling
// (lane >= 0, the pass recorded; if not first, only past this process's
// share), holding it back (holding, if mayHold and past the share) and
// dialing here (the dial counted in kc.dialing until dialEnds). Decisions on
// a key are made one at a time, so that each sees the others' dials and
// passes.
//
// A sibling's count includes the dials passed to it that its pool does not
// show yet, so that passes made while the first is still being dialed do not
// all go to the same sibling. Only as many passes count as there are units
// of the cap outside live connections, besides this request's and this
// process's dials (the siblings looked at first keep theirs): a pass that
// came to nothing (the sibling's request found a connection with room, or
// passed the unit on to a sibling holding fewer still) would otherwise count
// until passedFor. In a cold start of four workers under a cap of 16, the
// first, past its share, found every sibling holding 5 or 6 by its record,
// where they held 3 and no unit was on its way to them; it dialed its 6th
// and 7th, and the balancer moved three.
//
// A request that passed its dial before (not first) holds a unit that most
// likely came back from a pass that did not become a connection. So for it,
// one of the passes the record still counts is taken to be that one: each
// sibling with passes on record counts one fewer, and a pass to one of them
// takes the failed pass's place in the record.
func (n *Node) passOrDial(kc *keyCap, key orbitpool.Key, first, mayHold bool) (lane int, holding bool) {
	kc.passMu.Lock()
	defer kc.passMu.Unlock()
	now := sinceStart(time.Now())
	onTheirWay := int(kc.max.Load()) - n.pool.Live(key) - 1 - int(kc.dialing.Load())
	lane, held, own, ok := n.pool.NeediestBy(key, func(lane, held int) int {
		p, found := kc.passed[lane]
		switch {
		case !found:
			return held
		case held >= p.base+p.n || now-p.at > int64(passedFor):
			delete(kc.passed, lane)
			return held
		}
		pending := p.base + p.n - held
		if !first {
			pending--
		}
		pending = max(min(pending, onTheirWay), 0)
		onTheirWay -= pending
		return held + pending
	})
	own += int(kc.dialing.Load())
	past := n.pastShare(kc, own)
	if ok && own > held && (first || past) {
		if kc.passed == nil {
			kc.passed = make(map[int]passedDials)
		}
		p, found := kc.passed[lane]
		switch {
		case !found:
			p.base = held
			p.n = 1
		case first:
			p.n++
		}
		p.at = now
		kc.passed[lane] = p
		return lane, false
	}
	if mayHold && past {
		return -1, true
	}
	kc.dialing.Add(1)
	return -1, false
}

// pastShare reports whether own, the connections of a key whose record is kc
// that this process holds and dials, is at least its share of the key's
// cap: the cap over the fleet's processes, rounded up. A process alone in
// the fleet has no sibling to hold a dial back for.
func (n *Node) pastShare(kc *keyCap, own int) bool {
	lanes := int64(n.pool.LiveLanes())
	return lanes > 1 && int64(own) >= (kc.max.Load()+lanes-1)/lanes
}

// balances reports whether where the connections of the key whose record is
// kc live is evened out: the key is capped, ownership is not fixed, and the
// pool's order window lets a unit go to the sibling that holds fewer.
func (n *Node) balances(kc *keyCap) bool {
	return kc != nil && !n.fixed && n.pool.OrderWindow() != 0 && kc.max.Load() > 0
}

// moveEnded ends a move (lane >= 0) of oc that did not get as far as
// waiting for the upstream: the key may move again.
func (n *Node) moveEnded(oc *owned, lane int) {
	if lane >= 0 {
		n.moved(oc, true)
	}
}

// moved ends oc's move; promptly says the upstream closed its side within
// closeWait.
func (n *Node) moved(oc *owned, promptly bool) {
	kc := n.capOf(oc.key)
	if !promptly && !kc.off.Swap(true) {
		n.log.Info("upstream slow to close a connection that moved to another worker: its connections no longer move",
			zap.Stringer("id", oc.id), zap.Duration("waited_at_least", closeWait))
	}
	kc.moving.Store(false)
}
