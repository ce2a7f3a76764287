package proxy

import "sync/atomic"

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
// replacement. Each move lowers the sum of the squares of the processes'
// counts, so moves stop once no waiting sibling holds two fewer than
// another: a cap that does not divide evenly settles as [2 1 1], not moving
// for ever. Each move costs the upstream one connection (and for TLS one
// handshake); at most a cap's worth in all, from the worst start.
//
// Ownership evens out among the processes that wait; it does not follow
// uneven demand, which no count of connections can tell. In strict order
// (an order window of 0) a unit that comes free goes to the fleet's oldest
// waiter whoever owns it, so where connections live saves no relay, and
// nothing moves.
const balanceEvery = 64

// balanceToward counts a use of oc that ended with oc reusable and, once
// per balanceEvery such uses of oc's key, reports the lane oc should leave
// for (see balanceEvery), or -1 to keep it.
func (n *Node) balanceToward(oc *owned) int {
	limit := n.capOf(oc.key)
	if limit <= 0 || n.pool.OrderWindow() == 0 {
		return -1
	}
	c, ok := n.balances.Load(oc.key)
	if !ok {
		c, _ = n.balances.LoadOrStore(oc.key, new(atomic.Uint64))
	}
	if c.(*atomic.Uint64).Add(1)%balanceEvery != 0 || n.pool.Live(oc.key) < limit {
		return -1 // not this use's turn; or siblings may dial their own
	}
	lane, held, own, ok := n.pool.Neediest(oc.key)
	if !ok || own-held < 2 {
		return -1
	}
	n.stats.rebalanced.Add(1)
	return lane
}
