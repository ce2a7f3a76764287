package proxy

import (
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
// this process. Handing it the unit (orbitpool.CreationPermit.CloseToward)
// settles ownership where a move would later, without the connection a move
// costs the upstream (and for TLS a handshake): on a key whose connections
// are dialed again and again (retired by a request limit, closed by the
// upstream), the process whose request waited longest dials each one, and
// the balancer would move them back. A cold start is left to moves: its
// first dials come before any sibling waits.
func (n *Node) dialToward(key orbitpool.Key) int {
	if !n.balances(n.capOf(key)) {
		return -1
	}
	lane, held, own, ok := n.pool.Neediest(key)
	if !ok || own <= held {
		return -1
	}
	n.stats.dialsPassed.Add(1)
	return lane
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
