package proxy

import (
	"net"
	"time"

	"github.com/orbitproxy/orbit/internal/sockdiag"
	"github.com/orbitproxy/orbit/orbitpool"
	"go.uber.org/zap"
)

// An upstream that caps its own connections closes one past its cap as it
// accepts it. Under the fleet's cap, set to the upstream's, that happens
// when the upstream still counts connections the fleet has closed: a failed
// exchange's, closed after failedWait while the upstream was still busy
// with its request. The kernel keeps each such socket, orphaned, until the
// upstream closes its side, so the fleet can tell which of the connections
// its processes closed early (see early.go) the upstream still holds, and a
// new connection the upstream closes at once while it does was refused, not
// failed. The refused connection's unit stays held while they are held, so
// that the next waiter's dial is not refused in turn, and a replayable
// request on it goes again (see readError). Anything else that closes a new
// connection (a dropped request, an upstream that turns everyone away,
// other programs' connections to the same address) fails its request once,
// as net/http does.

// closedConn is a connection a process of the fleet closed before its
// upstream let it go, and when.
type closedConn struct {
	ends sockdiag.Conn
	at   time.Time
}

// maxEarly bounds the connections closed early a key remembers, latest
// kept.
const maxEarly = 32

// refusedWithin bounds how long after its dial an upstream's close of a new
// connection can be a refusal: an upstream at its cap closes a connection
// past it as it accepts it, within a scheduling delay or two of the dial on
// a loaded machine.
const refusedWithin = time.Second

// lingerRecheck is how often a held unit looks again at what its upstream
// still holds (as the pool's holds do).
const lingerRecheck = 100 * time.Millisecond

// maxRefusedHold bounds how long a unit is held for connections closed
// here: the kernel's default tcp_fin_timeout, after which it no longer
// keeps them waiting for the upstream's close either.
const maxRefusedHold = time.Minute

// enforcingFor is how long a refusal shows that an upstream enforces its
// cap (see keyCap.enforcing).
const enforcingFor = time.Minute

// ends names c's TCP connection by its two ends (zero if not TCP).
func (c *conn) ends() sockdiag.Conn {
	l, lok := c.raw.LocalAddr().(*net.TCPAddr)
	r, rok := c.raw.RemoteAddr().(*net.TCPAddr)
	if !lok || !rok {
		return sockdiag.Conn{}
	}
	return sockdiag.Conn{Local: l.AddrPort(), Remote: r.AddrPort()}
}

// closedEarly records a connection of key, ends, that this process closed
// before its upstream let it go, here and for the fleet's other processes
// (see writeEarly).
func (n *Node) closedEarly(key orbitpool.Key, kc *keyCap, ends sockdiag.Conn) {
	if !ends.Local.IsValid() {
		return
	}
	kc.earlyMu.Lock()
	defer kc.earlyMu.Unlock()
	if len(kc.early) == maxEarly {
		kc.early = kc.early[1:]
	}
	kc.early = append(kc.early, closedConn{ends, time.Now()})
	n.writeEarly(key, kc.early)
}

// earlyHeld counts the connections of key that the fleet's processes
// closed early and their upstream still holds, forgetting this process's
// once it holds none; -1 if the kernel does not say.
func (n *Node) earlyHeld(key orbitpool.Key, kc *keyCap) int {
	kc.earlyMu.Lock()
	defer kc.earlyMu.Unlock()
	now := time.Now()
	kept := kc.early[:0]
	for _, e := range kc.early {
		if now.Sub(e.at) < maxRefusedHold {
			kept = append(kept, e)
		}
	}
	if len(kept) < len(kc.early) {
		n.writeEarly(key, kept)
	}
	kc.early = kept
	var conns []sockdiag.Conn
	for _, e := range append(n.readEarly(key), kc.early...) {
		// A time ahead of now is a sibling's clock stepped back, or a
		// made-up one: the entry counts no longer than one of now.
		if age := now.Sub(e.at); age > -time.Second && age < maxRefusedHold {
			conns = append(conns, e.ends)
		}
	}
	if len(conns) == 0 {
		return 0
	}
	c, err := sockdiag.OrphansOf(conns)
	if err != nil {
		n.cannotCount(err)
		return -1
	}
	if c == 0 && len(kc.early) > 0 {
		kc.early = kc.early[:0]
		n.writeEarly(key, nil)
	}
	return c
}

// stillHeld reports whether the upstream still holds ends, a connection
// this process has closed.
func stillHeld(ends sockdiag.Conn) bool {
	c, err := sockdiag.OrphansOf([]sockdiag.Conn{ends})
	return err == nil && c > 0
}

// holdWhile returns once held reports false, looked at every
// lingerRecheck, or after maxRefusedHold, or when the node closes.
func (n *Node) holdWhile(held func() bool) {
	start := time.Now()
	t := time.NewTicker(lingerRecheck)
	defer t.Stop()
	for held() && time.Since(start) < maxRefusedHold {
		select {
		case <-t.C:
		case <-n.stop:
			return
		}
	}
}

// refusal records a connection of kc's key refused by its upstream, and
// reports whether to hold its unit: if the node is closing, the unit goes
// back at once. Otherwise the caller's goroutine, counted in n.closing, ends
// with kc.refusedHeld decremented.
func (n *Node) refusal(key orbitpool.Key, kc *keyCap) bool {
	n.stats.refused.Add(1)
	now := time.Now()
	kc.refusedAt.Store(sinceStart(now))
	if at := kc.refusedLogAt.Load(); sinceStart(now) >= at && kc.refusedLogAt.CompareAndSwap(at, sinceStart(now)+int64(lingerLogEvery)) {
		n.log.Info("capped upstream refused a new connection while it still holds connections closed here; its place under the cap stays held until it lets them go",
			zap.Int("held_open_upstream", n.earlyHeld(key, kc)))
	}
	n.closeMu.Lock()
	defer n.closeMu.Unlock()
	if n.isClosed {
		return false
	}
	n.closing.Add(1)
	kc.refusedHeld.Add(1)
	return true
}

// holdRefused takes oc, a connection its capped upstream refused (see
// conn.full), out of the pool, and keeps its unit of the key's budget while
// the upstream still holds as many of the connections the fleet closed
// early as refused units are kept: given back at once, it would go to the
// next waiter, whose dial would be refused as fast, and so on.
func (n *Node) holdRefused(oc *owned, exec *orbitpool.Execution, kc *keyCap) {
	oc.c.close()
	if !n.unslot(oc) {
		exec.Complete()
		return
	}
	n.holdRefusedUnit(oc.key, kc, func() {
		n.unregister(oc)
		exec.Complete()
	})
}

// holdRefusedUnit holds a refused unit of key (see holdRefused) and then
// gives it back with release.
func (n *Node) holdRefusedUnit(key orbitpool.Key, kc *keyCap, release func()) {
	if !n.refusal(key, kc) {
		release()
		return
	}
	go func() {
		defer n.closing.Done()
		n.holdWhile(func() bool { return n.earlyHeld(key, kc) >= int(kc.refusedHeld.Load()) })
		kc.refusedHeld.Add(-1)
		release()
	}()
}

// dialRefused reports whether err, a dial of key that began at start, is
// the upstream refusing the connection (see conn.full): a TLS upstream at
// its cap closes it during the handshake.
func (n *Node) dialRefused(key orbitpool.Key, kc *keyCap, start time.Time, err error) bool {
	return kc != nil && kc.max.Load() > 0 && time.Since(start) < refusedWithin &&
		isConnClosed(err) && n.earlyHeld(key, kc) > 0
}

// enforcing reports whether the key's upstream refused one of this
// process's connections within enforcingFor: it caps its connections
// itself, and a failed connection closed here before the upstream let it go
// has its replacement refused. So such a connection's unit stays held while
// the upstream holds it, rather than come back after failedWait (see
// Node.retireToward), however long ago another failed one waited in vain
// (see Node.lingeredInVain).
func (kc *keyCap) enforcing() bool {
	at := kc.refusedAt.Load()
	return at != 0 && sinceStart(time.Now())-at < int64(enforcingFor)
}
