package proxy

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/orbitproxy/orbit/governor"
	"github.com/orbitproxy/orbit/orbitpool"
	"go.uber.org/zap"
)

// NodeOptions configures a Node.
type NodeOptions struct {
	// SocketDir holds the fleet's forwarding sockets. Default:
	// SocketDir(pool.Spec().Path). A pool in process memory has no siblings
	// and gets no socket.
	SocketDir string
	// Governor, if set, is the process's one budget for exchange work:
	// every exchange, this process's own (through a Transport) and each it
	// forwards for a sibling, holds a worker and its buffers' memory for as
	// long as it runs (see Transport). Nil means no bound beyond the
	// pool's.
	Governor *governor.Governor
	// Admission is the backstop consulted before this process dials a new
	// upstream connection (with the connections it owns and is dialing as
	// in flight) and before it takes up a sibling's lease (with the
	// siblings' exchanges it runs as in flight). Default:
	// governor.DefaultAdmission().
	Admission *governor.Admission
	// DeadlineNearWindow is how close to its deadline a sibling's request
	// may still be taken up: closer, the lease is rejected, retry-safe,
	// as the caller's own Limiter would refuse it. The owner's wait for a
	// worker of its Governor ends that long before the deadline too.
	// Default 0: only a deadline already passed is rejected.
	DeadlineNearWindow time.Duration
	// MaxLeaseWait bounds how long a sibling's lease waits for a worker of
	// the Governor when its deadline does not end the wait sooner; then the
	// lease is rejected, retry-safe, and its capacity given back at once,
	// rather than aged out by the pool. Keep it below the pool's
	// reservation timeout. Default 500ms.
	MaxLeaseWait time.Duration
	// FixedOwnership keeps a capped key's connections with the process
	// that dialed them: none moves toward a sibling that holds fewer (see
	// balanceEvery). Default false: they move, with an order window.
	FixedOwnership bool
	// SweepInterval is how often idle connections are checked for an
	// upstream that closed them, and for their idle timeout and lifetime.
	// Default 1s.
	SweepInterval time.Duration
	// FailedCloseWait bounds how long a connection whose exchange failed
	// keeps its unit of a capped key's budget while the upstream, which may
	// still be answering the request, closes its side (see finish): an
	// upstream that caps its connections counts it until then, and refuses
	// the replacement a waiter dials sooner. Default and least: closeWait
	// (250ms).
	FailedCloseWait time.Duration
	// MaxIdlePeerStreams caps the idle unix streams kept to each sibling.
	// Default 64.
	MaxIdlePeerStreams int
	// Logger receives the node's logs. Default: none.
	Logger *zap.Logger
}

// Node is this process's part of a fleet: the pool table, the upstream
// connections it owns, the forwarding socket on which its siblings send it
// requests for those connections, and its own streams to its siblings. A
// process has one Node per pool; every Transport of the process shares it.
type Node struct {
	pool      *orbitpool.Pool
	log       *zap.Logger
	lingerErr sync.Once // lingering's failure, logged once
	gov       *governor.Governor
	adm       *governor.Admission
	peers     *peers
	srv       *server
	sweep     time.Duration
	fixed     bool // NodeOptions.FixedOwnership
	// failedWait is NodeOptions.FailedCloseWait.
	failedWait time.Duration

	slots   []atomic.Pointer[owned]  // HTTP/1.1 connections, by slot index in this process's lane
	h2slots []atomic.Pointer[h2conn] // HTTP/2 connections, likewise
	h2wake  chan *h2conn             // to the follower (h2follow.go)
	h2inst  h2Installs

	stats     nodeCounters
	spares    spares
	room      roomWaiters
	fleetRoom fleetRoom
	// tableFullLogged is when tableFull last warned, in unix nanoseconds.
	tableFullLogged atomic.Int64
	// open and dialing count the upstream connections this process owns
	// and is dialing: what a dial's admission sees as in flight.
	open, dialing atomic.Int64

	// stopCtx ends when Close begins (see dialContext); stop is its Done.
	stopCtx  context.Context
	stopped  context.CancelFunc
	stop     <-chan struct{}
	closed   chan struct{} // closed when Close has finished
	wg       sync.WaitGroup
	closeMu  sync.Mutex
	isClosed bool
	closing  sync.WaitGroup // connections retireInOrder is closing; Adds under closeMu while !isClosed
	draining atomic.Bool
	caps     sync.Map // orbitpool.Key -> *keyCap: see setCap
	sockDir  string   // the fleet's socket directory, "" for a pool without siblings

	// lingerLogAt is, by key (orbitpool.Key -> *atomic.Int64, since
	// processStart), when lingering may log again of its connections the
	// upstream still holds.
	lingerLogAt sync.Map
}

// NodeStats counts what a node did since it started.
type NodeStats struct {
	Created      uint64 // upstream connections dialed and registered
	ReusedLocal  uint64 // requests on a connection this process owns, reused
	ReusedRemote uint64 // requests sent to a sibling's connection
	ServedRemote uint64 // siblings' requests run on this process's connections
	// SplicedBodies counts siblings' response bodies that went from an
	// upstream connection to the sibling's stream by splice(2), never
	// entering this process.
	SplicedBodies uint64
	Refused       uint64 // siblings' leases refused, for any reason
	// RefusedBy splits Refused by reason: "stale" (the lease named no live
	// reservation), "gone" (the connection closed meanwhile), "closing"
	// (this process is leaving), "deadline" (passed or too near),
	// "busy" (no worker of the budget in time, or an HTTP/2 connection
	// full), "admission" (the admission backstop), "other".
	RefusedBy map[string]uint64
	// DialsNotAdmitted counts dials of new upstream connections the
	// admission backstop refused.
	DialsNotAdmitted uint64
	Retired          uint64 // connections closed and unregistered
	// Rebalanced counts connections of a capped key retired because this
	// process held at least two more of them than a sibling waiting for
	// one, so that the sibling creates the replacement.
	Rebalanced uint64
	// DialsPassed counts dials of a capped key's connections this process
	// left to a sibling waiting for one while holding fewer, which dialed
	// it instead (see Rebalanced, which costs a connection).
	DialsPassed uint64
	// DialsHeld counts dials of a capped key's connections this process
	// held back, holding its share of them already, for a sibling that
	// might wait for one (see DialsPassed).
	DialsHeld uint64
	// RelayDials counts connections of an uncapped HTTP/1.1 upstream this
	// process dialed because it kept relaying the upstream's requests
	// through siblings (see claimDial). Other requests dial only when none
	// of the fleet's connections has room (but for those that prefer a
	// connection of their own: a large body, an unreplayable request), so
	// the fleet holds about as many as the load keeps busy at once (one
	// between two exchanges counts as busy), plus these until they or the
	// siblings' idle connections time out.
	RelayDials uint64
	// UpstreamRefused counts new connections of a capped upstream that it
	// closed at once, before answering their first request, while it still
	// held connections the fleet had closed early (see refused.go).
	UpstreamRefused uint64
	// IdleBeforeReuse sums the time this process's HTTP/1.1 connections
	// sat idle in the pool between an exchange's end and the next one
	// taking them, over IdleReuses takes. Under a cap, with requests
	// waiting, its mean is how long the fleet takes to hand a connection
	// on: time in which the upstream's connection carries nothing.
	IdleBeforeReuse time.Duration
	IdleReuses      uint64
	Retries         uint64 // requests sent again after a retry-safe failure
	// Unpooled counts requests sent on a connection of their own, outside
	// the table, which had no room for another (see Transport.unpooled).
	Unpooled uint64
	// Evicted counts idle connections retired to make room in a full
	// table (see Node.evictIdle).
	Evicted       uint64
	OpenConns     int // upstream connections owned now: in the table, and idle outside it (see Transport.unpooled)
	IdlePeerConns int // idle unix streams to siblings now
}

type nodeCounters struct {
	created, reusedLocal, reusedRemote, servedRemote, retired, retries, dialsNotAdmitted, rebalanced, dialsPassed, dialsHeld, unpooled, evicted atomic.Uint64
	followed                                                                                                                                    atomic.Uint64 // HTTP/2 state changes seen by the follower
	idleBeforeReuse                                                                                                                             atomic.Int64  // nanoseconds, over idleReuses
	idleReuses                                                                                                                                  atomic.Uint64
	refused                                                                                                                                     atomic.Uint64 // see NodeStats.UpstreamRefused
	relayDials                                                                                                                                  atomic.Uint64 // see NodeStats.RelayDials
}

// NewNode joins the forwarding side of the fleet for pool: it listens on this
// process's socket (for a pool in a shared segment) and starts the idle
// sweep. Close it before closing the pool.
func NewNode(pool *orbitpool.Pool, opts NodeOptions) (*Node, error) {
	log := opts.Logger
	if log == nil {
		log = zap.NewNop()
	}
	spec := pool.Spec()
	n := &Node{
		pool:  pool,
		log:   log,
		gov:   opts.Governor,
		adm:   opts.Admission,
		sweep: opts.SweepInterval,
		fixed: opts.FixedOwnership,
		slots: make([]atomic.Pointer[owned], spec.ResourcesPerLane),

		failedWait: max(opts.FailedCloseWait, closeWait),

		h2slots: make([]atomic.Pointer[h2conn], spec.ResourcesPerLane),
		h2wake:  make(chan *h2conn, h2WakeQueue),
		closed:  make(chan struct{}),
	}
	n.stopCtx, n.stopped = context.WithCancel(context.Background())
	n.stop = n.stopCtx.Done()
	if n.sweep <= 0 {
		n.sweep = time.Second
	}
	if n.adm == nil {
		n.adm = governor.DefaultAdmission()
	}
	if spec.Path != "" {
		dir := opts.SocketDir
		if dir == "" {
			dir = SocketDir(spec.Path)
		}
		ln, err := listenUnix(SocketPath(dir, pool.Lane()))
		if err != nil {
			return nil, err
		}
		n.sockDir = dir
		n.peers = newPeers(dir, opts.MaxIdlePeerStreams)
		n.peers.log = log
		n.srv = newServer(ln, n, log)
		n.srv.maxIdlePerPeer = max(n.srv.maxIdlePerPeer, 2*n.peers.maxIdle)
		n.srv.gov = n.gov
		n.srv.adm = n.adm
		n.srv.near = max(opts.DeadlineNearWindow, 0)
		if opts.MaxLeaseWait > 0 {
			n.srv.maxLeaseWait = opts.MaxLeaseWait
		}
		n.wg.Add(1)
		go func() {
			defer n.wg.Done()
			n.srv.serve()
		}()
	}
	pool.SetLingering(n.lingering)
	n.wg.Add(2)
	go n.sweeper()
	go n.h2follower()
	return n, nil
}

// dialContext is ctx for a dial of a connection for the table, ended when
// the node closes too: a connection dialed after Close could not join the
// table, and its request fails at once rather than when the dial gives up
// (an upstream whose handshakes hang holds it until its deadline).
func (n *Node) dialContext(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(n.stopCtx, cancel)
	return ctx, func() { stop(); cancel() }
}

// Pool is the pool the node was made for.
func (n *Node) Pool() *orbitpool.Pool { return n.pool }

// Shutdown leaves the fleet without failing a sibling's request: new leases
// on this process's connections are refused, which their senders retry on
// another plan; idle connections leave the pool at once, so that nobody
// picks them, and busy ones as they come free; exchanges already under way
// for siblings run to their end, or until ctx ends. Then it closes as Close
// does.
func (n *Node) Shutdown(ctx context.Context) error {
	n.draining.Store(true)
	if n.srv != nil {
		n.srv.drain()
	}
	for i := range n.slots {
		if oc := n.slots[i].Load(); oc != nil {
			n.retireIdle(oc)
		}
	}
	n.closeIdleH2(true)
	n.spares.closeAll(false, n.spareClosed)
	if n.srv != nil {
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
	wait:
		for n.srv.active.Load() > 0 {
			select {
			case <-ctx.Done():
				n.log.Warn("leaving with siblings' exchanges still running", zap.Int64("exchanges", n.srv.active.Load()))
				break wait
			case <-tick.C:
			}
		}
	}
	return n.Close()
}

// Close stops serving siblings, closes the streams to them and every upstream
// connection this process owns, unregistering them. A Close (or Shutdown)
// made while another is under way returns when that one has finished, so
// that its caller may close the pool then.
func (n *Node) Close() error {
	n.closeMu.Lock()
	if n.isClosed {
		n.closeMu.Unlock()
		<-n.closed
		return nil
	}
	n.isClosed = true
	n.stopped()
	n.closeMu.Unlock()
	defer close(n.closed)
	if n.srv != nil {
		n.srv.close()
	}
	if n.peers != nil {
		n.peers.close()
	}
	n.wg.Wait()
	n.closing.Wait()
	n.removeEarlyFiles()
	for i := range n.slots {
		if oc := n.slots[i].Load(); oc != nil {
			oc.c.close()
			n.retire(oc)
		}
	}
	n.closeAllH2()
	n.spares.closeAll(true, n.spareClosed)
	return nil
}

// spareClosed counts out a spare connection that was closed.
func (n *Node) spareClosed() { n.open.Add(-1) }

// isStopped reports whether Close has begun.
func (n *Node) isStopped() bool {
	select {
	case <-n.stop:
		return true
	default:
		return false
	}
}

// Stats returns the node's counters.
func (n *Node) Stats() NodeStats {
	s := NodeStats{
		Created:         n.stats.created.Load(),
		ReusedLocal:     n.stats.reusedLocal.Load(),
		ReusedRemote:    n.stats.reusedRemote.Load(),
		ServedRemote:    n.stats.servedRemote.Load(),
		Rebalanced:      n.stats.rebalanced.Load(),
		DialsPassed:     n.stats.dialsPassed.Load(),
		DialsHeld:       n.stats.dialsHeld.Load(),
		RelayDials:      n.stats.relayDials.Load(),
		UpstreamRefused: n.stats.refused.Load(),
		IdleBeforeReuse: time.Duration(n.stats.idleBeforeReuse.Load()),
		IdleReuses:      n.stats.idleReuses.Load(),
		Retired:         n.stats.retired.Load(),
		Retries:         n.stats.retries.Load(),
		Unpooled:        n.stats.unpooled.Load(),
		Evicted:         n.stats.evicted.Load(),

		DialsNotAdmitted: n.stats.dialsNotAdmitted.Load(),
	}
	if n.srv != nil {
		s.SplicedBodies = n.srv.spliced.Load()
		s.RefusedBy = make(map[string]uint64)
		for i := range n.srv.refused {
			if v := n.srv.refused[i].Load(); v != 0 {
				s.RefusedBy[refuseReasons[i]] = v
				s.Refused += v
			}
		}
	}
	s.OpenConns = n.spares.len()
	for i := range n.slots {
		if n.slots[i].Load() != nil {
			s.OpenConns++
		}
		if n.h2slots[i].Load() != nil {
			s.OpenConns++
		}
	}
	if n.peers != nil {
		n.peers.mu.Lock()
		for _, l := range n.peers.idle {
			s.IdlePeerConns += len(l)
		}
		n.peers.mu.Unlock()
	}
	return s
}

// admitDial asks the admission backstop whether this process may dial one
// more upstream connection.
func (n *Node) admitDial() bool {
	if n.adm.Admit(int(n.open.Load() + n.dialing.Load())) {
		return true
	}
	n.stats.dialsNotAdmitted.Add(1)
	return false
}

// owned is an upstream connection this process owns and has registered.
type owned struct {
	id    orbitpool.ResourceID
	key   orbitpool.Key
	c     *conn
	s     *connSettings
	state atomic.Uint32
	// idle is when the conn last went idle, as sinceStart: the monotonic
	// clock, which a step of the wall clock does not move, and the one
	// HTTP/2 connections' idleAt is in, which evictIdle compares it with.
	idle atomic.Int64
}

// Connection states. A user takes an idle conn with one CAS; the sweep
// probes or retires only an idle one, with one CAS too, so the two never
// touch the same connection at once.
const (
	stIdle uint32 = iota
	stBusy
	stProbing
	stDead
)

// connSettings are the per-connection limits of the Transport that made it;
// an owner uses them for its siblings' requests too.
type connSettings struct {
	idleTimeout           time.Duration
	maxLifetime           time.Duration
	maxRequests           int
	maxHeaderBytes        int64
	expectContinueTimeout time.Duration
	responseHeaderTimeout time.Duration
}

// expired reports whether the conn must not be used again.
func (oc *owned) expired(now time.Time) bool {
	return oc.s.expired(oc.c, now, oc.idle.Load())
}

// expired reports whether c, idle since idle (as sinceStart), is past s's
// limits at now.
func (s *connSettings) expired(c *conn, now time.Time, idle int64) bool {
	if s.maxRequests > 0 && c.requests >= s.maxRequests {
		return true
	}
	if s.maxLifetime > 0 && now.Sub(c.created) >= s.maxLifetime {
		return true
	}
	if s.idleTimeout > 0 && sinceStart(now)-idle >= int64(s.idleTimeout) {
		return true
	}
	return false
}

// testHookTake, set only by tests, runs as take begins: after the lookup
// that found oc for an accepted execution, the window in which a drain
// (Shutdown, CloseIdleConnections, the sweep) may mark oc dead first.
var testHookTake atomic.Pointer[func(*owned)]

// take makes oc busy for the caller, who holds an accepted execution on it,
// after checking that it is still fit: within its limits and not closed by
// the upstream while idle. If it finds oc unfit, it marks it dead and
// reports unfit: the caller retires it (see takeFor). If oc is not idle,
// it reports neither: whoever holds it (a drain, the sweep, Close) does.
// now is the time of the take.
func (oc *owned) take(now time.Time, log *zap.Logger) (taken, unfit bool) {
	if h := testHookTake.Load(); h != nil {
		(*h)(oc)
	}
	if !oc.claimIdle(stBusy) {
		return false, false
	}
	if oc.expired(now) || !oc.c.idleAlive(log) {
		oc.state.Store(stDead)
		return false, true
	}
	return true, false
}

// claimIdle marks oc, if it is idle, with state to (busy for a user, dead
// for a drain), and reports whether it did. A probe of the sweep is waited
// out: the sweep leaves oc idle, or retires it.
func (oc *owned) claimIdle(to uint32) bool {
	for {
		switch oc.state.Load() {
		case stIdle:
			if oc.state.CompareAndSwap(stIdle, to) {
				return true
			}
		case stProbing:
			runtime.Gosched()
		default:
			return false
		}
	}
}

func (n *Node) lookup(id orbitpool.ResourceID) *owned {
	s := id.Slot()
	if s < 0 || s >= len(n.slots) {
		return nil
	}
	oc := n.slots[s].Load()
	if oc == nil || oc.id != id {
		return nil
	}
	return oc
}

// install records a new connection under its registered id, busy for its
// creator.
func (n *Node) install(id orbitpool.ResourceID, key orbitpool.Key, c *conn, s *connSettings) (*owned, error) {
	slot := id.Slot()
	if slot < 0 || slot >= len(n.slots) {
		return nil, fmt.Errorf("proxy: pool returned slot %d of %d", slot, len(n.slots))
	}
	oc := &owned{id: id, key: key, c: c, s: s}
	if kc := n.capOf(key); kc != nil && kc.max.Load() > 0 {
		// An upstream may enforce the cap too: when an exchange fails,
		// the connection keeps its unit until the upstream has let it go
		// (see finish).
		if _, c.lingers = c.raw.(*net.TCPConn); c.lingers {
			c.full = func() bool { return n.earlyHeld(key, kc) > 0 }
		}
	}
	oc.state.Store(stBusy)
	oc.idle.Store(sinceStart(time.Now()))
	// Close closes what is in the slots once nothing can be added.
	n.closeMu.Lock()
	defer n.closeMu.Unlock()
	if n.isClosed {
		return nil, ErrClosed
	}
	n.slots[slot].Store(oc)
	n.open.Add(1)
	return oc, nil
}

// retire takes oc out of the pool, once: it unregisters it, giving its unit
// of the key's budget back. Its caller closes the connection (unless a 101
// body owns it now).
func (n *Node) retire(oc *owned) {
	if n.unslot(oc) {
		if h := testHookRetire.Load(); h != nil {
			(*h)(oc)
		}
		n.unregister(oc)
	}
}

// testHookRetire, set only by tests, runs in retire between the connection's
// leaving this process's slots and its unregistering: the window in which
// siblings still find it in the pool, with room, and its owner refuses
// their leases as gone.
var testHookRetire atomic.Pointer[func(*owned)]

// unslot takes oc out of this process's slots, and reports whether it was
// there (a connection leaves once).
func (n *Node) unslot(oc *owned) bool {
	if !n.slots[oc.id.Slot()].CompareAndSwap(oc, nil) {
		return false
	}
	n.open.Add(-1)
	oc.state.Store(stDead)
	return true
}

func (n *Node) unregister(oc *owned) { n.unregisterToward(oc, -1) }

// dropPermit closes a creation permit that made no connection: the slot it
// held is free again.
func (n *Node) dropPermit(p *orbitpool.CreationPermit) {
	p.Close()
	n.room.signal(roomWake{event: roomFree})
}

func (n *Node) unregisterToward(oc *owned, lane int) {
	if err := n.pool.UnregisterToward(oc.id, lane); err != nil && !errors.Is(err, orbitpool.ErrClosed) {
		n.log.Debug("unregister", zap.Stringer("id", oc.id), zap.Error(err))
	}
	n.stats.retired.Add(1)
	n.room.signal(roomWake{event: roomFree})
}

// closeWait bounds how long a connection retired in good order keeps its
// place in the fleet's budget while the upstream closes its side.
const closeWait = 250 * time.Millisecond

// retireIdle retires oc in good order if it is idle, or idle again once
// the sweep's probe of it is over (see claimIdle).
func (n *Node) retireIdle(oc *owned) {
	if oc.claimIdle(stDead) {
		n.retireInOrder(oc, nil)
	}
}

// retireInOrder closes oc, a healthy connection that leaves the pool by
// policy (its request limit or lifetime, a drain), and only then gives its
// unit of the key's budget back: it half-closes the connection and waits, at
// most closeWait, for the upstream to close its side. An upstream that caps
// its connections counts this one until it has read the close, and the unit
// goes at once to a waiter, maybe a sibling's, that dials a replacement:
// sent before the upstream has read the close, that dial finds the cap full
// and is refused. Meanwhile nobody may be handed the connection: exec, the
// use that retires it, completes last; an idle one (exec nil) takes no new
// reservation.
func (n *Node) retireInOrder(oc *owned, exec *orbitpool.Execution) {
	n.retireToward(oc, exec, -1, nil)
}

// retireToward is retireInOrder for a connection that leaves so that lane
// creates the next one (see balanceEvery), -1 for the fleet's oldest waiter.
// failed is set, to the key's cap, for a connection whose exchange failed
// (lane -1 only), which waits failedWait rather than closeWait, and whose
// unit, if the upstream has not let it go by then, stays held while it
// still counts it, for an upstream that enforces its cap (see
// keyCap.enforcing).
func (n *Node) retireToward(oc *owned, exec *orbitpool.Execution, lane int, failed *keyCap) {
	complete := func() {
		if exec != nil {
			exec.Complete()
		}
	}
	if !n.unslot(oc) {
		oc.c.close()
		complete()
		n.moveEnded(oc, lane)
		return
	}
	n.closeMu.Lock()
	if n.isClosed {
		n.closeMu.Unlock()
		oc.c.close()
		n.unregister(oc)
		complete()
		n.moveEnded(oc, lane)
		return
	}
	n.closing.Add(1)
	n.closeMu.Unlock()
	if exec == nil || lane >= 0 {
		// Not to be handed out; and a move's connection no longer counts
		// as this process's (see Pool.Neediest).
		n.pool.SetCapacity(oc.id, 0)
	}
	go func() {
		defer n.closing.Done()
		switch {
		case failed != nil:
			ends := oc.c.ends()
			if !oc.c.closeAfterPeer(n.failedWait, n.stop) {
				n.closedEarly(oc.key, failed, ends)
				if failed.enforcing() {
					n.holdWhile(func() bool { return stillHeld(ends) })
				} else {
					n.lingeredInVain(oc, failed)
				}
			}
		case lane < 0:
			oc.c.closeAfterPeer(closeWait, nil)
		default:
			start := time.Now()
			closed := oc.c.closeAfterPeer(moveCloseWait, n.stop)
			n.moved(oc, closed && time.Since(start) <= closeWait)
		}
		n.unregisterToward(oc, lane)
		complete()
	}()
}

// lingeredInVain records that the upstream of oc, a connection whose
// exchange failed, did not close its side within failedWait: it was still busy
// with the request, most likely, and will be with the next one that fails.
// Holding each such connection's unit that long makes the key's waiters wait
// for nothing an upstream that closes at once would need, so for lingerPause
// the key's failed connections close at once, as the stock transport closes
// them.
func (n *Node) lingeredInVain(oc *owned, kc *keyCap) {
	now := sinceStart(time.Now())
	if until := kc.noLingerUntil.Swap(now + int64(lingerPause)); until < now {
		n.log.Info("upstream slow to close a connection whose exchange failed: the key's failed connections close at once for a while",
			zap.Stringer("id", oc.id), zap.Duration("waited", n.failedWait), zap.Duration("for", lingerPause))
	}
}

// lingerPause is how long a key's failed connections close at once after
// its upstream kept one open past failedWait. Then they wait for the upstream
// again: one that was busy then may not be now, and under a cap it refuses a
// replacement dialed too soon.
var lingerPause = time.Minute

// takeFor takes oc, the connection exec was accepted on (nil if gone), for
// exec, and reports whether it did. If not, exec ends; and a connection take
// found unfit leaves the pool: in good order if the upstream still holds it
// open (it is past its limits), at once if the upstream closed it. One take
// found not idle is left alone: whoever marked it (a drain, the sweep) is
// retiring it, maybe waiting for the upstream's close, which a probe of the
// connection would wait for too, and a close would cut short.
func (n *Node) takeFor(oc *owned, exec *orbitpool.Execution) bool {
	if oc == nil {
		exec.Complete()
		return false
	}
	now := time.Now()
	taken, unfit := oc.take(now, n.log)
	switch {
	case taken:
		n.stats.idleBeforeReuse.Add(max(sinceStart(now)-oc.idle.Load(), 0))
		n.stats.idleReuses.Add(1)
		return true
	case !unfit:
		exec.Complete()
	case oc.c.idleAlive(n.log):
		n.retireInOrder(oc, exec)
	default:
		n.retire(oc)
		oc.c.close()
		exec.Complete()
	}
	return false
}

// finish is an exchange's end on an owned connection: the connection goes
// idle, or leaves the pool, and then the execution completes. That order
// matters: Complete wakes waiters, who must find the connection ready.
func (n *Node) finish(oc *owned, exec *orbitpool.Execution, o outcome) {
	switch o {
	case outcomeReusable:
		now := time.Now()
		kc := n.capOf(oc.key)
		switch {
		case n.lookup(oc.id) != oc:
			oc.c.close() // out of the pool already
		case n.retireOverCap(oc, kc):
		case oc.expired(now) || n.draining.Load():
			n.retireInOrder(oc, exec)
			return
		default:
			if lane := n.balanceToward(oc, kc); lane >= 0 {
				n.retireToward(oc, exec, lane, nil)
				return
			}
			oc.idle.Store(sinceStart(now))
			oc.state.Store(stIdle)
			// Once its key's waiters have had it: its key's oldest
			// paused request reuses it, else the oldest may evict it.
			defer n.room.signalKey(oc.key, 1, true)
		}
	case outcomeHijacked:
		n.retire(oc)
	default:
		kc := n.capOf(oc.key)
		if oc.c.refused.Load() && kc != nil {
			n.holdRefused(oc, exec, kc)
			return
		}
		if oc.c.lingers && kc != nil && (kc.lingering() || kc.enforcing()) {
			// A capped upstream counts the connection until it has
			// read the close: a replacement dialed sooner is refused.
			n.retireToward(oc, exec, -1, kc)
			return
		}
		oc.c.close()
		n.retire(oc)
	}
	exec.Complete()
}

// use runs req on oc under exec, with bufs exchange buffers. onDone runs when
// the exchange is over; stopBody, if set, interrupts a pending read of the
// request body.
func (n *Node) use(oc *owned, exec *orbitpool.Execution, req *http.Request, bufs int, onDone, stopBody func()) (*http.Response, error) {
	return n.exchange(oc.c, oc.s, req, bufs, onDone, stopBody, func(_ *conn, o outcome) {
		n.finish(oc, exec, o)
	})
}

// exchange runs req on c with s's settings and bufs exchange buffers; done
// is told how the exchange left c, then onDone runs (see exchangeOpts).
func (n *Node) exchange(c *conn, s *connSettings, req *http.Request, bufs int, onDone, stopBody func(), done func(*conn, outcome)) (*http.Response, error) {
	orig := req
	req, withHead := withBodyAhead(req)
	opts := &exchangeOpts{
		bodyWithHead:          withHead,
		bufs:                  bufs,
		maxHeaderBytes:        s.maxHeaderBytes,
		expectContinueTimeout: s.expectContinueTimeout,
		responseHeaderTimeout: s.responseHeaderTimeout,
		stopBody:              stopBody,
		log:                   n.log,
		done:                  done,
		release:               onDone,
	}
	resp, err := c.roundTrip(req, opts)
	if resp != nil {
		resp.Request = orig
	}
	return resp, err
}

// evictIdle retires, to make room in a full table, this process's
// connection that has sat idle longest (an HTTP/2 one with no stream too),
// as net/http's pool lets its least recently used idle connection go past
// MaxIdleConns, and returns its ID, or 0 if it found none. An HTTP/1.1 one
// of a capped key, and an HTTP/2 one, leave in good order (the unit comes
// back once the upstream has closed its side: see retireInOrder and
// retireH2InOrder); another leaves the table at once. One that a request
// takes as it is chosen is passed over for the next, a few times at most.
func (n *Node) evictIdle() orbitpool.ResourceID {
	for range evictTries {
		var oc *owned
		var hc *h2conn
		since := int64(math.MaxInt64) // when it went idle, in sinceStart's terms
		for i := range n.slots {
			if c := n.slots[i].Load(); c != nil && c.state.Load() == stIdle {
				if t := c.idle.Load(); t < since {
					oc, since = c, t
				}
			}
		}
		for i := range n.h2slots {
			if c := n.h2slots[i].Load(); c != nil && c.active.Load() == 0 && c.ended.Load() {
				if t := c.idleAt.Load(); t < since && c.offered() {
					oc, hc, since = nil, c, t
				}
			}
		}
		switch {
		case hc != nil:
			// Offers stop while the table says whether anyone holds it:
			// a stream that took it as it was chosen holds its unit
			// before it counts as a stream.
			if !n.pauseH2(hc) {
				continue
			}
			if !n.unheld(hc.id) {
				// Taken: offers resume as its state is read again. A
				// holder may yet end with no stream (a lease
				// withdrawn, a wait for a worker run out), so it is
				// not drained.
				n.syncH2Off(hc, n.syncH2Now)
				continue
			}
			if !n.stopOffersH2(hc) {
				continue // draining meanwhile: its drain retires it
			}
			n.retireH2InOrder(hc)
			n.stats.evicted.Add(1)
			return hc.id
		case oc != nil:
			if !oc.claimIdle(stDead) {
				continue
			}
			if kc := n.capOf(oc.key); kc != nil && kc.max.Load() > 0 {
				n.retireInOrder(oc, nil)
			} else {
				n.retire(oc)
				oc.c.close()
			}
			n.stats.evicted.Add(1)
			return oc.id
		default:
			return 0
		}
	}
	return 0
}

// evictTries is how many idle connections evictIdle chooses, at most, when
// requests take the ones it chose first.
const evictTries = 4

// leaving reports whether the connection id (0 for none) still holds its
// slot of the table.
func (n *Node) leaving(id orbitpool.ResourceID) bool {
	if id == 0 {
		return false
	}
	_, err := n.pool.Capacity(id)
	return err == nil
}

// tableFullLogEvery is the least time between two warnings that the table
// had no room for a connection.
const tableFullLogEvery = 10 * time.Second

// tableFull warns, at most every tableFullLogEvery, that the table had no
// room for a connection (err says why), and what the request does instead.
func (n *Node) tableFull(err error, instead string) {
	now := time.Now().UnixNano()
	last := n.tableFullLogged.Load()
	if now-last < int64(tableFullLogEvery) || !n.tableFullLogged.CompareAndSwap(last, now) {
		return
	}
	if c := n.log.Check(zap.WarnLevel, "the fleet's table has no room for another connection; "+instead+": raise the orbit_pool app's conns_per_process or keys"); c != nil {
		c.Write(zap.Error(err), zap.Uint64("unpooled_so_far", n.stats.unpooled.Load()))
	}
}

// accept implements acceptor: a sibling presents a lease on one of our
// connections.
func (n *Node) accept(b []byte, waited time.Duration) (execution, error) {
	var l orbitpool.Lease
	if err := l.UnmarshalBinary(b); err != nil {
		return nil, &rejectError{code: rejectStale, err: err}
	}
	exec, err := n.pool.Accept(l)
	if err != nil {
		code := rejectUnknown
		switch {
		case errors.Is(err, orbitpool.ErrStale):
			code = rejectStale
		case errors.Is(err, orbitpool.ErrClosed):
			code = rejectClosing
		}
		return nil, &rejectError{code: code, err: err}
	}
	// Counted before anything here may refuse the lease (its connection
	// gone, an HTTP/2 connection full): the wait was the key's either way.
	exec.CountWait(waited)
	if hc := n.lookupH2(exec.ID()); hc != nil {
		return n.acceptH2(hc, exec)
	}
	oc := n.lookup(exec.ID())
	if oc == nil {
		if hc := n.awaitH2(exec.ID()); hc != nil {
			return n.acceptH2(hc, exec)
		}
	}
	if !n.takeFor(oc, exec) {
		return nil, &rejectError{code: rejectGone, err: errors.New("connection closed")}
	}
	n.stats.servedRemote.Add(1)
	return &ownerExec{n: n, oc: oc, exec: exec}, nil
}

// drop implements leaseDropper: the lease is taken up and given back at
// once, without touching its connection, so that a lease this process will
// not serve returns its capacity now rather than when the pool ages it out.
func (n *Node) drop(b []byte, waited time.Duration) {
	var l orbitpool.Lease
	if l.UnmarshalBinary(b) != nil {
		return
	}
	if exec, err := n.pool.Accept(l); err == nil {
		exec.CountWait(waited)
		exec.Complete()
	}
}

type ownerExec struct {
	n    *Node
	oc   *owned
	exec *orbitpool.Execution
	bufs int
}

func (e *ownerExec) roundTrip(req *http.Request, stopBody func()) (*http.Response, error) {
	// Cancelled (the server closing, or the peer gone), the exchange fails
	// as if the owner's stream had closed under it: a replayable request
	// may go again, and one of which the kernel took no byte, whatever its
	// method, goes elsewhere.
	if err := req.Context().Err(); err != nil {
		e.abandon()
		return nil, &Error{Op: "write", RetrySafe: true, Err: err}
	}
	written := e.oc.c.cw.n.Load()
	resp, err := e.n.use(e.oc, e.exec, req, e.bufs, nil, stopBody)
	if err != nil && isContextErr(err) {
		// The failed exchange closed the connection, so no later one
		// has written on it.
		err = &Error{Op: "write", RetrySafe: e.oc.c.cw.n.Load() == written, idleClosed: true, Err: err}
	}
	return resp, err
}

func (e *ownerExec) setBufs(k int) { e.bufs = k }

func (e *ownerExec) maxHeaderBytes() int64 { return e.oc.s.maxHeaderBytes }

// abandon gives the connection back unused: it comes free as after a
// reusable exchange, and leaves the pool if it must (a drain, its limits, a
// lowered cap), in good order.
func (e *ownerExec) abandon() {
	e.n.finish(e.oc, e.exec, outcomeReusable)
}

// sweeper closes idle connections past their idle timeout or lifetime, and
// those the upstream closed while they sat idle, so that no request (here or
// in a sibling) picks a dead one, and the fleet's budget gets the unit back.
func (n *Node) sweeper() {
	defer n.wg.Done()
	t := time.NewTicker(n.sweep)
	defer t.Stop()
	for {
		select {
		case <-n.stop:
			return
		case <-t.C:
			n.sweepOnce()
			n.sweepH2()
			n.spares.sweep(time.Now(), n.log, n.spareClosed)
		}
	}
}

func (n *Node) sweepOnce() {
	now := time.Now()
	for i := range n.slots {
		oc := n.slots[i].Load()
		if oc == nil || !oc.state.CompareAndSwap(stIdle, stProbing) {
			continue
		}
		switch {
		case !oc.c.idleAlive(n.log):
			// Out of the pool before the close: until then siblings
			// take it, and are refused.
			oc.state.Store(stDead)
			n.retire(oc)
			oc.c.close()
			continue
		case n.retireOverCap(oc, n.capOf(oc.key)):
			continue
		case oc.expired(now):
			oc.state.Store(stDead)
			n.retireInOrder(oc, nil)
			continue
		}
		oc.state.Store(stIdle)
	}
}

// keyCap is this process's record of a key's cap: the fleet-wide cap the
// latest Transport to use the key was configured with, and the state of
// retiring connections over it (retireOverCap) and of moving them between
// processes (balanceToward).
type keyCap struct {
	max     atomic.Int64  // 0: none
	leaving atomic.Int64  // connections leaving for a lowered cap
	uses    atomic.Uint64 // reusable uses of this process's connections
	moving  atomic.Bool   // a connection is leaving toward a sibling
	// noLingerUntil (nanoseconds since processStart): the upstream kept
	// a failed connection open past failedWait, so until then the key's
	// failed connections close at once (see lingeredInVain).
	noLingerUntil atomic.Int64
	// refusedHeld counts the units of refused connections held now (see
	// Node.holdRefused); refusedAt (nanoseconds since processStart, 0 for
	// never) is when the upstream last refused one.
	refusedHeld, refusedAt atomic.Int64
	// early are the connections this process closed before the upstream
	// let them go, latest last (see Node.closedEarly).
	earlyMu sync.Mutex
	early   []closedConn
	// refusedLogAt (nanoseconds since processStart): no refusal is logged
	// before then (see Node.refusal).
	refusedLogAt atomic.Int64

	off     atomic.Bool  // the upstream was slow to close a moved connection
	dialing atomic.Int64 // this process's dials of the key under way
	// noHoldUntil (nanoseconds since processStart): a dial held back for a
	// sibling found none to pass to, so until then none is held back (see
	// dialToward). Zero until the first such hold: the cold start, whose
	// holds last longer (holdFor).
	noHoldUntil atomic.Int64
	passMu      sync.Mutex
	passed      map[int]passedDials // by lane, the dials passed there and not yet seen live
	remoteMu    sync.Mutex
	remotes     []netip.AddrPort        // the upstream's addresses, for lingering
	published   map[netip.AddrPort]bool // the addresses told the fleet (see sawRemote)
}

// dialBegins and dialEnds bracket a dial of the key by this process, which
// counts among its connections meanwhile (see dialToward). kc may be nil: a
// key without a cap.
func (kc *keyCap) dialBegins() {
	if kc != nil {
		kc.dialing.Add(1)
	}
}

func (kc *keyCap) dialEnds() {
	if kc != nil {
		kc.dialing.Add(-1)
	}
}

// register registers the connection a dial of the key made under permit,
// with room for capacity uses, and ends the dial (dialEnded, which calls
// dialEnds), as one step for passOrDial, which reads the pool and the count
// of dials under passMu: a decision between the two steps counted the
// connection twice, and held its dial back below the process's share. The
// dial has ended whatever the error.
func (kc *keyCap) register(permit *orbitpool.CreationPermit, capacity int, dialEnded func()) (*orbitpool.Execution, error) {
	if kc != nil {
		kc.passMu.Lock()
		defer kc.passMu.Unlock()
	}
	defer dialEnded()
	return permit.RegisterAndAccept(capacity)
}

// lingering reports whether a failed connection of the key waits for its
// upstream to close before it gives its unit back.
func (kc *keyCap) lingering() bool {
	return sinceStart(time.Now()) >= kc.noLingerUntil.Load()
}

// processStart is the origin of the times keyCap keeps in integers, so that
// they follow the monotonic clock: a step of the wall clock neither
// lengthens nor cuts short a pause.
var processStart = time.Now()

func sinceStart(t time.Time) int64 { return int64(t.Sub(processStart)) }

// setCap records the fleet-wide cap on key's connections that the latest
// Transport to use key was configured with (0: none), and the dial address
// addr (host:port) if it is an IP address (see sawRemote).
func (n *Node) setCap(key orbitpool.Key, max int, addr string) {
	v, ok := n.caps.Load(key)
	if !ok {
		v, _ = n.caps.LoadOrStore(key, new(keyCap))
	}
	kc := v.(*keyCap)
	kc.max.Store(int64(max))
	if a, err := netip.ParseAddrPort(addr); err == nil {
		n.sawRemote(key, kc, a)
	}
}

// capOf is key's record, nil if no Transport has used key.
func (n *Node) capOf(key orbitpool.Key) *keyCap {
	v, ok := n.caps.Load(key)
	if !ok {
		return nil
	}
	return v.(*keyCap)
}

// overCap reports whether the fleet holds more connections of key than its
// cap allows now: a cap lowered by a reload. Such a connection is retired
// when idle (by the sweep) or when its exchange ends, rather than kept.
func (n *Node) overCap(key orbitpool.Key) bool { return n.capOf(key).over(n.pool, key, 0) }

// over reports whether the fleet holds more connections of key than the cap
// allows, not counting skip of them; false for no cap.
func (kc *keyCap) over(p *orbitpool.Pool, key orbitpool.Key, skip int64) bool {
	if kc == nil {
		return false
	}
	max := kc.max.Load()
	return max > 0 && int64(p.Live(key))-skip > max
}

// retireOverCap closes and retires oc, at once, if its key (whose record is
// kc) holds more connections than its cap allows, not counting those of
// this process already leaving for the same reason: exchanges that end
// together must not all retire their connections for one excess. No
// replacement follows such a connection, so it need not wait for the
// upstream's close. It reports whether it retired oc.
func (n *Node) retireOverCap(oc *owned, kc *keyCap) bool {
	if !kc.over(n.pool, oc.key, 0) {
		return false // the common case, whatever is leaving
	}
	for {
		l := kc.leaving.Load()
		if !kc.over(n.pool, oc.key, l) {
			return false
		}
		if kc.leaving.CompareAndSwap(l, l+1) {
			break
		}
	}
	oc.state.Store(stDead)
	oc.c.close()
	n.retire(oc)
	kc.leaving.Add(-1)
	return true
}
