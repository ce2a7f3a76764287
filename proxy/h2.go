package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/orbitproxy/orbit/orbitpool"
	"go.uber.org/zap"
	"golang.org/x/net/http2"
)

// HTTP/2 upstream connections. One connection is one pool resource whose
// capacity is the peer's SETTINGS_MAX_CONCURRENT_STREAMS (at most
// orbitpool.MaxCapacity): a request anywhere in the fleet reserves one stream
// of it. The owner runs every stream on the connection with
// golang.org/x/net/http2's ClientConn, made on the connection it dialed, as
// net/http does; a sibling's request arrives over the unix leg as HTTP/1.1,
// and its response goes back the same way, chunked so that trailers pass
// whatever the body's length, with a head flag that restores what HTTP/2
// said. The capacity follows the peer's later SETTINGS, read from the
// ClientConn's state when a stream starts or ends, whenever the connection's
// read loop reads the socket (h2follow.go) and at every sweep, at most one
// read per connection at a time and never on a goroutine other connections
// share, since a blocked write holds it up (see syncH2); a
// GOAWAY (or the ClientConn deciding not to reuse the connection) drains the
// resource: capacity 0, so nothing new is reserved, while the streams in
// flight finish; the connection leaves the pool when the last one ends.
//
// Built with Go 1.27, x/net's ClientConn wraps net/http's own HTTP/2 client
// (h2Wrapped), whose state says less: the limit it reports is what may
// start plus what runs, and a GOAWAY shows only once the connection closes.
// There a GOAWAY lowers the capacity to the streams running, the close
// (x/net's MarkDead) retires the connection, a changed limit is read again
// before the pool follows it (wrappedLimit), and a merely full connection is
// used (wrappedTakes).

// Upstream protocols, as the Key and the dialer see them.
const (
	protoHTTP1 = ""    // HTTP/1.1 (and, for https, ALPN http/1.1 only)
	protoHTTP2 = "h2"  // https: ALPN offers h2, then http/1.1
	protoH2C   = "h2c" // http: HTTP/2 with prior knowledge
)

// h2conn is an HTTP/2 connection this process owns.
type h2conn struct {
	id      orbitpool.ResourceID
	key     orbitpool.Key
	cc      *http2.ClientConn
	c       *conn  // the connection cc runs on, for a close in good order
	scheme  string // of the requests it carries: "http" for h2c, "https"
	created time.Time
	s       *connSettings

	// active counts streams started here and not yet ended; mu orders
	// capacity changes, so that the pool is told of them in the order the
	// ClientConn's state was read.
	active atomic.Int64
	idleAt atomic.Int64 // when a stream last ended (or hc was made), in nanoseconds since processStart
	// ended: a stream has ended here. Until one has, its creator's may
	// not have started yet, and evictIdle leaves it be.
	ended    atomic.Bool
	mu       sync.Mutex
	capacity int  // last set in the pool; guarded by mu
	draining bool // capacity 0 for good; guarded by mu

	// limit is the peer's stream limit as last read with room to spare,
	// under x/net's wrapper (see wrappedTakes).
	limit atomic.Int64

	// unsettled is set when the ClientConn went on counting a stream that
	// ended here past settleWait (see wrappedTakes): until a reading shows
	// no more streams than run here, the capacity leaves room for those
	// streams too (see wrappedLimit).
	unsettled atomic.Bool
	// lingering is set when a stream whose unit came back may go on
	// counting in the ClientConn for longer than a moment: one whose
	// RoundTrip failed (the ClientConn resets a stream whose context
	// ended or whose request body failed and, if it read nothing from the
	// connection since it sent the request, counts it until the peer
	// answers the PING sent with the RST_STREAM), or an empty response
	// whose END_STREAM is yet to come. A response body closed early
	// resets its stream after its headers were read, so it is not
	// counted. Cleared by a reading that counts no stream at all: one
	// that counts no more streams than run here may miss one of them
	// (not registered yet, or let go before its end ran here) and count a
	// reset stream in its place (see wrappedLimit).
	lingering atomic.Bool

	noted atomic.Bool // queued for the node's follower (h2follow.go)

	// syncing is set while a read of cc's state is under way (see
	// syncH2), resync when another was asked for meanwhile.
	syncing atomic.Bool
	resync  atomic.Bool

	// sending lets one request at a time into the ClientConn until its
	// headers are written, under x/net's wrapper (see roundTrip).
	sending chan struct{}
}

// streamCapacity is the pool capacity a peer's stream limit allows. The
// ClientConn reports 0 before it has read the peer's SETTINGS, which
// startH2 waits for; after them, 0 is the peer's own limit (it takes no
// new stream on the connection for now), and the connection has no room:
// a request waits for another one or dials it, as net/http's HTTP/2
// client then dials, rather than wait in the ClientConn for a stream the
// peer will not allow.
func streamCapacity(max uint32) int {
	if max > orbitpool.MaxCapacity {
		return orbitpool.MaxCapacity
	}
	return int(max)
}

// newH2Transport is the x/net/http2 transport whose ClientConns run this
// Transport's HTTP/2 connections. Compression is the Transport's own
// business, as for HTTP/1.1; connections are made and pooled by the fleet.
//
// The ClientConns take the response header and 100-continue timeouts and
// the header limit from the net/http transport theirs is configured on, as
// net/http's own HTTP/2 client does: without one, a stream would wait for
// its response head for as long as its context allows, and send at once a
// body that asked to wait for a 100. The limit is MaxResponseHeaderBytes as
// configured, which x/net turns into the HTTP/2 header list size with the
// same allowance for field overhead as stock's client (and 10 MiB when
// unset), so that a head near the limit passes or fails as it does there.
func (t *Transport) newH2Transport() *http2.Transport {
	t1 := &http.Transport{
		ExpectContinueTimeout:  t.settings.expectContinueTimeout,
		ResponseHeaderTimeout:  t.settings.responseHeaderTimeout,
		MaxResponseHeaderBytes: max(t.MaxResponseHeaderBytes, 0),
	}
	t2, err := http2.ConfigureTransports(t1)
	if err != nil {
		// Only a transport configured for HTTP/2 before refuses.
		panic(fmt.Sprintf("proxy: configuring HTTP/2 on a new transport: %v", err))
	}
	t2.ConnPool = h2DeadPool{t}
	t2.AllowHTTP = true
	t2.DisableCompression = true
	t2.StrictMaxConcurrentStreams = true
	// The idle timeout is the sweep's (syncH2), which retires a connection
	// in good order: the ClientConn's would close it under the pool, and
	// its unit would come back at once.
	return t2
}

// h2DeadPool is the x/net/http2 transport's ClientConnPool. The fleet pools
// the connections; what this gives is MarkDead, which x/net calls when a
// ClientConn gets GOAWAY or closes, and which wakes the follower (see
// h2follow.go) to read the connection's state at once. With Go 1.27's
// net/http client under x/net's wrapper (h2Wrapped) it is the only word of a
// connection that closed after a GOAWAY, once its last stream ended:
// nothing reads the socket after that.
type h2DeadPool struct{ t *Transport }

var errNoH2Pool = errors.New("proxy: the fleet pools HTTP/2 connections, not x/net")

func (p h2DeadPool) GetClientConn(*http.Request, string) (*http2.ClientConn, error) {
	return nil, errNoH2Pool
}

func (p h2DeadPool) MarkDead(cc *http2.ClientConn) {
	if n := p.t.Node; n != nil {
		if hc := n.h2ByClientConn(cc); hc != nil {
			n.noteH2(hc)
		}
	}
}

// h2ByClientConn is the installed connection that runs cc, if any.
func (n *Node) h2ByClientConn(cc *http2.ClientConn) *h2conn {
	for i := range n.h2slots {
		if hc := n.h2slots[i].Load(); hc != nil && hc.cc == cc {
			return hc
		}
	}
	return nil
}

// h2Wanted reports whether a connection dialed for u speaks HTTP/2: h2c
// always, https when ALPN chose h2.
func h2Wanted(u *upstream, c *conn) bool {
	switch u.Proto {
	case protoH2C:
		return true
	case protoHTTP2:
		return c.tls != nil && c.tls.NegotiatedProtocol == http2.NextProtoTLS
	}
	return false
}

// startH2 runs the HTTP/2 client side on a connection just dialed and waits
// for the peer's SETTINGS (a PING's ack comes after them), so that the
// connection is registered with the stream limit the peer announced.
func (t *Transport) startH2(ctx context.Context, u *upstream, c *conn) (*http2.ClientConn, int, error) {
	cc, err := t.h2t.NewClientConn(c.nc)
	if err != nil {
		c.close()
		return nil, 0, &Error{Op: "dial", RetrySafe: true, Err: fmt.Errorf("http2: %w", err)}
	}
	timeout := t.DialTimeout
	if timeout <= 0 {
		timeout = defaultDialTimeout
	}
	pctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := cc.Ping(pctx); err != nil {
		cc.Close()
		return nil, 0, &Error{Op: "dial", RetrySafe: true, Err: fmt.Errorf("http2 settings from %s: %w", u.Addr, err)}
	}
	st := cc.State()
	if st.Closing || st.Closed {
		cc.Close()
		return nil, 0, &Error{Op: "dial", RetrySafe: true, Err: fmt.Errorf("http2: %s %w", u.Addr, errGoAwayAtStart)}
	}
	return cc, streamCapacity(st.MaxConcurrentStreams), nil
}

// errGoAwayAtStart is a new connection's GOAWAY before its first stream: an
// upstream going away, as a stream refused so is (see wentAway).
var errGoAwayAtStart = errors.New("refused the connection (GOAWAY)")

func (n *Node) installH2(id orbitpool.ResourceID, key orbitpool.Key, cc *http2.ClientConn, c *conn, scheme string, capacity int, s *connSettings) (*h2conn, error) {
	slot := id.Slot()
	if slot < 0 || slot >= len(n.h2slots) {
		return nil, fmt.Errorf("proxy: pool returned slot %d of %d", slot, len(n.h2slots))
	}
	hc := &h2conn{id: id, key: key, cc: cc, c: c, scheme: scheme, created: time.Now(), s: s, capacity: capacity, sending: make(chan struct{}, 1)}
	hc.limit.Store(int64(capacity))
	hc.idleAt.Store(sinceStart(hc.created))
	// As in install: Close closes what is in the slots once nothing can
	// be added.
	n.closeMu.Lock()
	defer n.closeMu.Unlock()
	if n.isClosed {
		return nil, ErrClosed
	}
	n.h2slots[slot].Store(hc)
	n.open.Add(1) // an owned connection for the dial admission, as install counts one
	return hc, nil
}

// h2Installs tracks HTTP/2 connections registered in the pool and not yet
// installed in h2slots.
type h2Installs struct {
	mu      sync.Mutex
	pending int
	done    chan struct{} // closed, and replaced, when one is installed
}

func (n *Node) beginH2Install() {
	n.h2inst.mu.Lock()
	n.h2inst.pending++
	if n.h2inst.done == nil {
		n.h2inst.done = make(chan struct{})
	}
	n.h2inst.mu.Unlock()
}

func (n *Node) endH2Install() {
	n.h2inst.mu.Lock()
	n.h2inst.pending--
	close(n.h2inst.done)
	n.h2inst.done = make(chan struct{})
	n.h2inst.mu.Unlock()
}

// h2InstallWait bounds awaitH2: an install follows its registration at
// once, unless the process is starved.
const h2InstallWait = time.Second

// awaitH2 is lookupH2 for a lease on a resource that may be registered and
// not yet installed: it waits while an install is in progress here.
func (n *Node) awaitH2(id orbitpool.ResourceID) *h2conn {
	deadline := time.NewTimer(h2InstallWait)
	defer deadline.Stop()
	for {
		n.h2inst.mu.Lock()
		pending, done := n.h2inst.pending, n.h2inst.done
		n.h2inst.mu.Unlock()
		if hc := n.lookupH2(id); hc != nil || pending == 0 {
			return hc
		}
		select {
		case <-done:
		case <-deadline.C:
			return n.lookupH2(id)
		}
	}
}

func (n *Node) lookupH2(id orbitpool.ResourceID) *h2conn {
	s := id.Slot()
	if s < 0 || s >= len(n.h2slots) {
		return nil
	}
	hc := n.h2slots[s].Load()
	if hc == nil || hc.id != id {
		return nil
	}
	return hc
}

// retireH2 unregisters hc and closes its connection, once. hc leaves
// h2slots first, and the pool only once its ClientConn is closed, which may
// take a while: its capacity goes to 0 in between, or the pool would go on
// offering it, and every lease a sibling took on it would be refused
// (accept no longer finds it) and given back, and taken again at once,
// each refusal costing the sibling's request a retry.
func (n *Node) retireH2(hc *h2conn) {
	if !n.h2slots[hc.id.Slot()].CompareAndSwap(hc, nil) {
		return
	}
	n.open.Add(-1)
	n.stopOffersH2(hc)
	if h := testHookRetireH2.Load(); h != nil {
		(*h)(n, hc)
	}
	hc.cc.Close()
	n.unregisterH2(hc)
}

// testHookRetireH2, set only by tests, runs in retireH2 once hc has left
// h2slots, before its ClientConn is closed and it leaves the pool: tests
// present leases there to make the race with the close certain.
var testHookRetireH2 atomic.Pointer[func(*Node, *h2conn)]

func (n *Node) unregisterH2(hc *h2conn) {
	if err := n.pool.Unregister(hc.id); err != nil && !errors.Is(err, orbitpool.ErrClosed) {
		n.log.Debug("unregister", zap.Stringer("id", hc.id), zap.Error(err))
	}
	n.stats.retired.Add(1)
	n.room.signal(roomWake{event: roomFree})
}

// retireH2InOrder is retireH2 for a connection with no stream that leaves
// by policy (a drain, its idle timeout or lifetime, the fleet's cap, the
// upstream's GOAWAY), as retireInOrder is for HTTP/1.1: it tells the
// upstream it is done (close_notify under TLS, and the socket's half-close)
// and gives the unit back only once the upstream has closed its socket, or
// closeWait has passed. An upstream that caps its connections counts this
// one until then, and a replacement dialed at once would find the cap full.
// Under TLS the upstream's close_notify comes first, and ends the
// ClientConn's read loop: the socket is then read here until it closes.
func (n *Node) retireH2InOrder(hc *h2conn) {
	w := hc.c.watch
	if w == nil {
		n.retireH2(hc)
		return
	}
	// A stream that starts from now on is refused as "not usable", which
	// is retry-safe; one that started since the caller saw none running
	// ends first, and its end retires the connection (see syncH2).
	hc.cc.SetDoNotReuse()
	if hc.active.Load() > 0 {
		return
	}
	if !n.h2slots[hc.id.Slot()].CompareAndSwap(hc, nil) {
		return
	}
	n.open.Add(-1)
	n.closeMu.Lock()
	if n.isClosed {
		n.closeMu.Unlock()
		hc.cc.Close()
		n.unregisterH2(hc)
		return
	}
	n.closing.Add(1)
	n.closeMu.Unlock()
	w.retiring.Store(true)
	go func() {
		defer n.closing.Done()
		deadline := time.Now().Add(closeWait)
		// A write of the ClientConn's blocked in the socket (an upstream
		// that stopped reading) holds the TLS connection's write lock,
		// which close_notify waits for: the socket closed at the
		// deadline ends both.
		force := time.AfterFunc(closeWait, func() { w.Conn.Close() })
		defer force.Stop()
		if _, err := hc.c.halfClose(); err == nil {
			t := time.NewTimer(closeWait)
			select {
			case <-w.ended:
			case <-t.C:
			}
			t.Stop()
			if !w.readEnded.Load() && time.Now().Before(deadline) {
				w.Conn.SetReadDeadline(deadline)
				io.CopyN(io.Discard, w.Conn, maxCloseDrain+1)
			}
		}
		hc.cc.Close()
		w.Conn.Close()
		n.unregisterH2(hc)
	}()
}

// stopOffersH2 takes hc's capacity to 0 for good: the pool offers it no
// more. It reports whether this call did (hc was not draining yet).
func (n *Node) stopOffersH2(hc *h2conn) bool { return n.zeroH2(hc, true) }

// pauseH2 takes hc's capacity to 0 until its state is next read, and
// reports whether it did (hc was neither draining nor paused).
func (n *Node) pauseH2(hc *h2conn) bool { return n.zeroH2(hc, false) }

// zeroH2 takes hc's capacity to 0 in the pool, for good (draining) or
// until its state is next read, and reports whether it did.
func (n *Node) zeroH2(hc *h2conn, forGood bool) bool {
	hc.mu.Lock()
	defer hc.mu.Unlock()
	if hc.draining || !forGood && hc.capacity == 0 {
		return false
	}
	hc.draining = forGood
	hc.capacity = 0
	if err := n.pool.SetCapacity(hc.id, 0); err != nil && !errors.Is(err, orbitpool.ErrClosed) && !errors.Is(err, orbitpool.ErrStale) {
		n.log.Debug("capacity to 0", zap.Stringer("id", hc.id), zap.Bool("draining", forGood), zap.Error(err))
	}
	return true
}

// goneForGood reports whether hc, which usableH2 found unable to take a
// stream, will take none again: it is draining, or its ClientConn is
// closing or closed (a GOAWAY, or x/net's not reusing it) while the pool
// has yet to drain it, as the state read off usableH2's goroutine will.
// Without x/net's wrapper, whose ClientConn says it cannot take a request
// only once it will never take one (StrictMaxConcurrentStreams), that is
// every such connection; its State would wait behind a blocked write (see
// syncH2). The wrapper's State takes no write lock.
func (hc *h2conn) goneForGood() bool {
	if hc.isDraining() || !h2Wrapped {
		return true
	}
	st := hc.cc.State()
	return st.Closed || st.Closing
}

// unheld reports whether nobody holds the connection id: no use of it, and
// no reservation pending.
func (n *Node) unheld(id orbitpool.ResourceID) bool {
	u, err := n.pool.Users(id)
	return err == nil && u == 0
}

// offered reports whether the pool offers hc: it is not draining, and its
// capacity is not 0.
func (hc *h2conn) offered() bool {
	hc.mu.Lock()
	defer hc.mu.Unlock()
	return !hc.draining && hc.capacity > 0
}

func (hc *h2conn) isDraining() bool {
	hc.mu.Lock()
	defer hc.mu.Unlock()
	return hc.draining
}

// drainH2 stops new streams on hc for good; it leaves the pool once idle.
func (n *Node) drainH2(hc *h2conn) {
	n.stopOffersH2(hc)
	if hc.active.Load() == 0 {
		n.retireH2InOrder(hc)
	}
}

// syncH2 brings the pool's view of hc in line with its ClientConn: the
// peer's current stream limit, a GOAWAY or a closed connection, the
// Transport's limits on the connection, and the fleet's cap on its key.
//
// x/net/http2 reads the stream limit in ClientConn.State under the
// connection's write lock, which a write blocked in the socket holds (an
// upstream that stopped reading a request body: nothing bounds the write),
// so a read of the state may wait as long as that write. At most one is in
// flight per connection: a caller that finds one under way asks it to read
// again when it is done (resync) and goes on, rather than queue behind it.
// The goroutines every connection shares (the sweep, the follower) and a
// request deciding whether to use hc (usableH2) read on a goroutine of
// their own (syncH2Off), so that a blocked connection holds up nobody
// else's. A stream's end reads here: x/net/http2's own end of the stream
// waits for the write lock too.
func (n *Node) syncH2(hc *h2conn) { n.stateH2(hc, n.syncH2Now, false) }

// syncH2Off is syncH2, or f (which reads hc's state too), on a goroutine of
// its own.
func (n *Node) syncH2Off(hc *h2conn, f func(*h2conn)) { n.stateH2(hc, f, true) }

// stateH2 runs f as the one read of hc's state in flight (see syncH2), here
// or, if off, on a new goroutine; or leaves a resync to the read in flight.
// A resync set after the runner last looked is seen either by the runner,
// or by this caller, which finds syncing clear and runs it itself.
func (n *Node) stateH2(hc *h2conn, f func(*h2conn), off bool) {
	for {
		if hc.syncing.CompareAndSwap(false, true) {
			if off {
				go n.runStateH2(hc, f)
			} else {
				n.runStateH2(hc, f)
			}
			return
		}
		hc.resync.Store(true)
		if hc.syncing.Load() {
			return
		}
	}
}

// runStateH2 runs f holding hc.syncing, then syncH2Now for as long as a
// resync was asked for meanwhile. A resync asked for before f runs is not
// cleared then: syncing is taken before a runner off the caller's goroutine
// is scheduled, and f may be the follower's check, which looks at the
// stream limit only, so the full sync asked for (a stream's end, which
// retires a draining connection) runs after it. At worst a read of the
// state more.
func (n *Node) runStateH2(hc *h2conn, f func(*h2conn)) {
	for {
		f(hc)
		hc.syncing.Store(false)
		if !hc.resync.Load() || !hc.syncing.CompareAndSwap(false, true) {
			return
		}
		hc.resync.Store(false)
		f = n.syncH2Now
	}
}

// syncH2Now is syncH2's work, run as the one read of hc's state in flight.
func (n *Node) syncH2Now(hc *h2conn) {
	st := hc.state()
	switch {
	case st.Closed:
		n.retireH2(hc)
		return
	case st.Closing, hc.isDraining(), n.draining.Load(), n.overCap(hc.key),
		hc.s.maxLifetime > 0 && time.Since(hc.created) >= hc.s.maxLifetime,
		hc.idleExpired():
		n.drainH2(hc)
		return
	}
	c := streamCapacity(st.MaxConcurrentStreams)
	if h2Wrapped {
		c = wrappedLimit(hc, st, hc.loadCapacity())
	}
	hc.mu.Lock()
	if hc.draining || c == hc.capacity {
		hc.mu.Unlock()
		return
	}
	if err := n.pool.SetCapacity(hc.id, c); err != nil {
		hc.mu.Unlock()
		if !errors.Is(err, orbitpool.ErrClosed) {
			n.log.Debug("set capacity", zap.Stringer("id", hc.id), zap.Error(err))
		}
		return
	}
	n.log.Debug("upstream changed its stream limit", zap.Stringer("id", hc.id), zap.Int("from", hc.capacity), zap.Int("to", c))
	more := c - hc.capacity
	hc.capacity = c
	hc.mu.Unlock()
	if more > 0 {
		// Room for more streams (after a pause, too); with nobody
		// holding it, an idle connection that may be evicted. One
		// held (an eviction passed it over, see evictIdle) wakes no
		// evictor: it would pass it over again.
		n.room.signalKey(hc.key, more, hc.active.Load() == 0 && n.unheld(hc.id))
	}
}

// wrappedLimit is the capacity hc's state st allows under x/net's wrapper
// (h2Wrapped), given hc's capacity, current. The wrapper reports the limit
// as Available()+InFlight(), read under two locks: a stream that ends
// between them puts a reading low, one that starts puts it high, and a pool
// that followed such readings would flap below the peer's steady limit and
// dial connections it does not need. So a reading that differs from the
// capacity is read three times more, and a lower limit is taken as the
// highest reading, a higher one as the lowest. A reading with room to
// spare is the peer's limit (hc.limit).
//
// While hc is unsettled (see wrappedTakes), the capacity is at most the
// streams running here plus the room the ClientConn has: streams that ended
// here and that it still counts take their room, as in net/http's client,
// which dials rather than wait for them. A reading that counts no more
// streams than run here ends that.
func wrappedLimit(hc *h2conn, st http2.ClientConnState, current int) int {
	m, room := st.MaxConcurrentStreams, hasRoom(st)
	if c := streamCapacity(m); c != current {
		lower := c < current
		for range 3 {
			next := hc.state()
			if lower && next.MaxConcurrentStreams > m || !lower && next.MaxConcurrentStreams < m {
				m, room, st = next.MaxConcurrentStreams, hasRoom(next), next
			}
		}
	}
	if room {
		hc.limit.Store(int64(m))
	}
	c := streamCapacity(m)
	if running, active := hc.noteReading(st); hc.unsettled.Load() {
		c = min(c, streamCapacity(uint32(min(active+max(int64(m)-running, 0), int64(orbitpool.MaxCapacity)))))
	}
	return c
}

// noteReading ends hc's lingering and unsettled as far as the reading st
// shows they are over, and returns the streams st counts and those running
// here. Only a reading that counts no stream at all shows that none that
// ended here lingers: one that counts no more streams than run here may
// miss one of them (registered late, or let go before its end ran here) and
// count a reset stream in its place. Such a reading ends unsettled all the
// same: ended early, it costs at most a settle more, where kept, the
// capacity would stay low until the next reading without the stream that
// ends now.
func (hc *h2conn) noteReading(st http2.ClientConnState) (running, active int64) {
	running, active = int64(st.StreamsActive)+int64(st.StreamsReserved), hc.active.Load()
	if running == 0 && hc.lingering.Load() {
		hc.lingering.Store(false)
	}
	if running <= active && hc.unsettled.Load() {
		hc.unsettled.Store(false)
	}
	return running, active
}

// settleWait bounds settledState's wait for the ClientConn to let go of
// the streams that ended here. A stream that ended goes once its writer
// goroutine runs: within microseconds on an idle machine, and after
// several milliseconds at times on a loaded two-core one. A request that
// gives up waiting goes elsewhere, and may dial. The whole wait is paid
// where the ClientConn goes on counting a stream: one reset here whose
// PING the peer leaves unanswered, after which the connection's capacity
// leaves that stream's room out (see wrappedLimit), and no request waits
// for it again.
const settleWait = 25 * time.Millisecond

// settledState is hc's state once the ClientConn counts no more streams
// than run here (true: while hc is lingering, only a reading that counts
// none), or once it has room, or as it is after settleWait (a stream reset
// here counts until the peer answers a PING).
func (hc *h2conn) settledState() (http2.ClientConnState, bool) {
	deadline := time.Now().Add(settleWait)
	for i := 0; ; i++ {
		st := hc.state()
		if st.Closed || st.Closing {
			return st, false
		}
		if running, active := hc.noteReading(st); running <= active && !hc.lingering.Load() {
			return st, true
		}
		if hasRoom(st) {
			// Room now, whatever the ClientConn still counts (a stream
			// reset here whose PING goes unanswered counts for good):
			// a request sent now does not wait.
			return st, false
		}
		if time.Now().After(deadline) {
			return st, false
		}
		if i < 10 {
			runtime.Gosched()
		} else {
			time.Sleep(50 * time.Microsecond)
		}
	}
}

// state is hc's ClientConn's state, read again where it shows room under
// x/net's wrapper (h2Wrapped). The wrapper reads the limit (what may start
// plus what runs) and the streams that run under two holds of net/http's
// lock, the streams last: a stream that ends between the two shows room
// that is not there when the peer has lowered its limit below the streams
// running, for the limit then reads as the streams in flight. A request
// sent on such a reading waits in the ClientConn for another stream to end,
// where net/http's client dials. The second reading, all of it after the
// first, counts the stream that ended in neither of its halves, so room is
// shown only where both readings show it (at the cost of one more reading,
// about 100 ns, for a request that finds room). A reading without room is
// taken as it is: it errs towards a dial. Streams start only from this
// pool, which counts them in the capacity it offers.
func (hc *h2conn) state() http2.ClientConnState {
	st := hc.cc.State()
	if h2Wrapped && hasRoom(st) {
		st = hc.cc.State()
	}
	return st
}

// hasRoom reports whether st has a stream limit above the streams in flight.
func hasRoom(st http2.ClientConnState) bool {
	return int64(st.MaxConcurrentStreams) > int64(st.StreamsActive)+int64(st.StreamsReserved)
}

// loadCapacity is hc.capacity, read under hc.mu.
func (hc *h2conn) loadCapacity() int {
	hc.mu.Lock()
	defer hc.mu.Unlock()
	return hc.capacity
}

// idleExpired reports whether hc has run no stream for its idle timeout.
func (hc *h2conn) idleExpired() bool {
	return hc.s.idleTimeout > 0 && hc.active.Load() == 0 && sinceStart(time.Now())-hc.idleAt.Load() >= int64(hc.s.idleTimeout)
}

// usable reports whether hc may start a stream now; a connection that
// cannot is drained. One idle past its timeout cannot, whenever the sweep
// next runs (the ClientConn, which has no idle timeout, would take it).
//
// The pool must not offer hc again once this says no: the caller plans
// again at once (or its sibling does, refused). Reading hc's state here
// would wait behind a write blocked on it (see syncH2), past the request's
// own deadline, so hc is paused instead (capacity 0, at once) and its state
// read off this goroutine, which gives the capacity back or drains hc. The
// state, not CanTakeNewRequest, says whether hc is done for: x/net's
// wrapper of net/http's HTTP/2 client (Go 1.27) reports a full connection
// as unable too (see wrappedTakes).
func (n *Node) usableH2(hc *h2conn) bool {
	switch {
	case hc.idleExpired():
		n.drainH2(hc)
		n.drainExpiredH2(hc.key)
	case !h2Wrapped && hc.cc.CanTakeNewRequest(), h2Wrapped && hc.wrappedTakes():
		return true
	default:
		n.pauseH2(hc)
		n.syncH2Off(hc, n.syncH2Now)
	}
	return false
}

// wrappedTakes is CanTakeNewRequest under x/net's wrapper (h2Wrapped), read
// from the state: the wrapper's CanTakeNewRequest reads its do-not-reuse
// flag without the lock SetDoNotReuse writes it under (a data race in x/net
// v0.62.0), and its State takes that lock, and no write lock.
//
// It also takes a connection that is merely full: one running as many
// streams as the pool gives it room for, which the pool offered because a
// stream that ended still counts in the ClientConn for a moment. Its
// RoundTrip waits for that stream to go, as x/net's own client does under
// StrictMaxConcurrentStreams (whose CanTakeNewRequest says yes); pausing it
// instead would hand its capacity back at once, to be offered and paused
// again until the stream went. After a stream that may linger (see
// h2conn.lingering), it is taken only once the ClientConn has let go of
// the streams that ended here, or shows room (settledState): a stream
// reset here counts there until the peer answers a PING, and a request
// sent meanwhile would wait for a stream that runs to end, where
// net/http's client dials. A connection read full below its
// capacity (the peer lowered its limit, and the pool has not followed yet)
// or below the limit last read with room is not merely full: it is taken
// only if a reading without the streams that ended here shows room
// (settledState). Otherwise it is paused, and the request goes elsewhere
// rather than wait for one of its streams to end. Paused at once, as it
// was, a connection whose limit was lowered to exactly the streams its
// callers want had no capacity until its state was read again, and a
// request that came meanwhile dialed.
//
// The wrapper tells a GOAWAY only once the connection has closed: a
// connection that got one while full looks full, and a stream sent there
// is refused retry-safe, at no retry's cost (connGone), and takes the
// connection out of the pool's offers (see useH2).
func (hc *h2conn) wrappedTakes() bool {
	st := hc.state()
	if st.Closed || st.Closing {
		return false
	}
	running := st.StreamsActive + st.StreamsReserved
	if running < streamCapacity(st.MaxConcurrentStreams) {
		return true
	}
	c := hc.loadCapacity()
	if c <= 0 {
		return false
	}
	// Full, at the limit last read with room or below it (the peer has
	// lowered its limit, perhaps below the streams running), or below
	// the capacity, and the reading may count a stream that ended here.
	// Sent now, a request could wait in the ClientConn for enough streams
	// to end to come under the limit, where net/http's client dials: for
	// a long stream to end, if the stream counted is one reset here whose
	// PING the peer leaves unanswered. Once the ClientConn has let go of
	// the streams that ended here, the state says whether there is room.
	atLimit := running >= c && int64(st.MaxConcurrentStreams) >= hc.limit.Load()
	if atLimit && !hc.lingering.Load() {
		// Merely full at the peer's limit, and no stream that may linger
		// ended here since the ClientConn last counted none that ended:
		// a stream that ended goes from there once its writer runs,
		// which a busy machine can hold up past settleWait.
		return true
	}
	next, settled := hc.settledState()
	if next.Closed || next.Closing {
		return false
	}
	if atLimit && settled {
		return true
	}
	if !hasRoom(next) {
		if !settled {
			// A stream reset here before the peer answered it counts
			// in the ClientConn until the peer answers a PING, which
			// it may never do. Paused and read again, the connection
			// would be offered again at once, and each offer refused
			// settleWait later (a sibling's lease at a retry's cost): the
			// capacity leaves those streams' room out until they go
			// (see wrappedLimit).
			hc.unsettled.Store(true)
		}
		return false
	}
	hc.limit.Store(int64(next.MaxConcurrentStreams))
	return true
}

// roundTrip is hc.cc.RoundTrip, which under x/net's wrapper (h2Wrapped)
// lets one request at a time in until its headers are written. The wrapper
// reserves a stream for each request as it comes in, while net/http's
// client lets one request at a time wait for a stream, and takes a
// reservation back only as a request's turn comes. A peer that lowers its
// stream limit while reservations are out can set them above the new
// limit: the request whose turn it is then waits for a stream that the
// reservations of those behind it keep taken, until its context ends, with
// every request behind it (golang/go#70809 reports stalls of this kind from
// reservations). One request in at a time holds at most one reservation,
// its own, which its turn takes back. The order is the one net/http's
// client keeps already: a request's headers go out after those of the
// requests before it. Where the request's context already carries a trace
// (reverse_proxy's), httptrace joins the two by reflection: about 0.35 µs
// a request against reverse_proxy's one-hook trace, measured alone, of
// which a join by hand would save half. The caller's WaitWatcher goes in
// the same trace.
func (hc *h2conn) roundTrip(req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	w := waitWatcher(ctx)
	if !h2Wrapped {
		if w != nil {
			req = req.WithContext(httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{WroteHeaders: w.WroteHeaders}))
		}
		return hc.cc.RoundTrip(req)
	}
	select {
	case hc.sending <- struct{}{}:
	case <-ctx.Done():
		return nil, gateWaitError{ctx.Err()}
	}
	g := &sendGate{c: hc.sending}
	defer g.open() // also if the round trip panics: the gate is the connection's
	g.trace.WroteHeaders = g.open
	if w != nil {
		g.trace.WroteHeaders = func() { g.open(); w.WroteHeaders() }
	}
	return hc.cc.RoundTrip(req.WithContext(httptrace.WithClientTrace(ctx, &g.trace)))
}

// gateWaitError is the error of a request whose context ended while it
// waited at the send gate: it never reached the ClientConn, so it left no
// stream behind.
type gateWaitError struct{ err error }

func (e gateWaitError) Error() string { return e.err.Error() }
func (e gateWaitError) Unwrap() error { return e.err }

// sendGate lets the next request into a connection (h2conn.roundTrip) once
// this one's headers are written, or its round trip is over.
type sendGate struct {
	c     chan struct{}
	once  sync.Once
	trace httptrace.ClientTrace
}

func (g *sendGate) open() { g.once.Do(func() { <-g.c }) }

// drainExpiredH2 drains this process's other connections for key that are
// idle past their timeout, as the next sweep would: the caller found one,
// and the others of the same burst are likely expired with it. Left to the
// sweep, each would be offered in turn and refused, and a sibling's
// request, whose every refused lease costs it one of its retries, could run
// out of them before it reached a live connection or dialed one.
func (n *Node) drainExpiredH2(key orbitpool.Key) {
	for i := range n.h2slots {
		if hc := n.h2slots[i].Load(); hc != nil && hc.key == key && hc.idleExpired() && !hc.isDraining() {
			n.drainH2(hc)
		}
	}
}

// useH2 runs req as one stream of hc under exec, which holds the stream's
// unit of capacity until the response body ends (or is closed, which resets
// the stream upstream), or the exchange fails. onDone runs then too, or,
// for a response, once x/net is done with the request body: an upstream
// that ends its stream before it has the body leaves x/net's writer in the
// caller's body, with what the exchange holds of the governor, until x/net
// closes it as the stream ends (see h2ReqBody).
func (n *Node) useH2(hc *h2conn, exec *orbitpool.Execution, req *http.Request, onDone func()) (*http.Response, error) {
	hc.active.Add(1)
	orig := req
	var rb *h2ReqBody
	if onDone != nil && req.Body != nil && req.Body != http.NoBody {
		rb = &h2ReqBody{ReadCloser: req.Body}
		req = shallowWithBody(req, rb)
	}
	var once sync.Once
	end := func() {
		once.Do(func() {
			// Stored before the count drops: a sweep in between would
			// find the connection idle since its last idle spell.
			hc.idleAt.Store(sinceStart(time.Now()))
			hc.ended.Store(true)
			idle := hc.active.Add(-1) == 0
			n.syncH2(hc)
			exec.Complete()
			// A stream's room, for its key; or, with no stream left, an
			// idle connection that may be evicted (see evictIdle).
			n.room.signalKey(hc.key, 1, idle)
			switch {
			case rb != nil:
				rb.after(onDone)
			case onDone != nil:
				onDone()
			}
		})
	}
	resp, err := hc.roundTrip(req)
	if resp != nil {
		resp.Request = orig
	}
	if err != nil {
		// Failed before its response: the ClientConn may have reset the
		// stream with nothing read since it was sent (its context
		// ended, or its request body failed), and then counts it until
		// the peer answers a PING. One that never got past the send
		// gate left no stream.
		if !errors.As(err, new(gateWaitError)) {
			hc.lingering.Store(true)
		}
		herr := h2Error(req, err)
		if pe, ok := herr.(*Error); ok && pe.connGone {
			// The connection takes no stream again (a GOAWAY, or not
			// usable). Under x/net's wrapper (h2Wrapped) its state does
			// not say so until it closes, and it reads as merely full
			// (wrappedTakes): left offered, it would refuse the request's
			// retries too, each but the first at a retry's cost.
			n.stopOffersH2(hc)
		}
		// A ClientConn that fails a request before its stream began
		// neither reads nor closes the body: onDone runs now.
		rb = nil
		end()
		return nil, herr
	}
	if resp.Body == nil || resp.Body == http.NoBody || resp.ContentLength == 0 || req.Method == http.MethodHead {
		// No body to read: x/net/http2 gives length 0 to a response that
		// ended with its HEADERS (gRPC's trailers-only, a 204) and an
		// empty body to any answer to HEAD. The unit comes back now, not
		// when the caller closes a body it need not read, as on the
		// HTTP/1.1 path; the ClientConn still counts the stream against
		// the peer's limit until its END_STREAM, if that is yet to come:
		// a body that is not NoBody may wait for it, for as long as the
		// peer likes, so a connection full with it is not merely full
		// (see wrappedTakes).
		if resp.Body != nil && resp.Body != http.NoBody {
			hc.lingering.Store(true)
		}
		end()
		return resp, nil
	}
	resp.Body = &h2Body{rc: resp.Body, end: end}
	return resp, nil
}

// h2Error classifies a failed stream: refused by the peer, or not started
// because the connection went away (GOAWAY naming an earlier stream, or the
// connection unusable), reached nothing upstream, as x/net/http2's own
// Transport judges when it retries.
func h2Error(req *http.Request, err error) error {
	if cerr := req.Context().Err(); cerr != nil {
		return &Error{Op: "roundtrip", Err: fmt.Errorf("%w: %w", cerr, err)}
	}
	var se http2.StreamError
	retry := errors.As(err, &se) && se.Code == http2.ErrCodeRefusedStream
	switch msg := err.Error(); msg {
	case "http2: timeout awaiting response headers":
		return &Error{Op: "read", Err: fmt.Errorf("%w: %w", ErrResponseHeaderTimeout, err)}
	case "http2: client conn not usable", "http2: Transport received Server's graceful shutdown GOAWAY",
		"http2: client conn could not be established":
		retry = true
	default:
		// The stream reset for a head over the header list size, final
		// or the interim heads of a caller without a hook: the same
		// failure as an HTTP/1.1 head over the limit, and the
		// connection carries on.
		if strings.HasSuffix(msg, "http2: response header list larger than advertised limit") ||
			strings.HasSuffix(msg, "; header list too large") {
			return &Error{Op: "read", Err: fmt.Errorf("%w: %w", ErrHeaderTooLarge, err)}
		}
	}
	if retry {
		e := &Error{Op: "roundtrip", RetrySafe: true, Err: fmt.Errorf("%w: %w", ErrConnBroken, err)}
		// Not usable, or left out of a GOAWAY: the connection takes no
		// stream again (see Error.connGone).
		e.connGone = se.Code != http2.ErrCodeRefusedStream
		return e
	}
	return &Error{Op: "roundtrip", Err: fmt.Errorf("%w: %w", ErrConnBroken, err)}
}

// h2ReqBody tells when x/net is done with a request body: once a Read has
// failed (io.EOF included) or the body is closed, with no Read under way.
// x/net closes every request body, on a goroutine of its own once the
// stream is over, and a Read that Close interrupts returns then.
type h2ReqBody struct {
	io.ReadCloser

	mu      sync.Mutex
	reading bool
	over    bool   // a Read failed, or Close was called
	then    func() // see after
}

func (b *h2ReqBody) Read(p []byte) (int, error) {
	b.mu.Lock()
	b.reading = true
	b.mu.Unlock()
	n, err := b.ReadCloser.Read(p)
	b.mu.Lock()
	b.reading = false
	b.over = b.over || err != nil
	fn := b.ready()
	b.mu.Unlock()
	if fn != nil {
		fn()
	}
	return n, err
}

func (b *h2ReqBody) Close() error {
	err := b.ReadCloser.Close()
	b.mu.Lock()
	b.over = true
	fn := b.ready()
	b.mu.Unlock()
	if fn != nil {
		fn()
	}
	return err
}

// after runs fn once x/net is done with the body: now, if it is.
func (b *h2ReqBody) after(fn func()) {
	b.mu.Lock()
	b.then = fn
	fn = b.ready()
	b.mu.Unlock()
	if fn != nil {
		fn()
	}
}

// ready takes the function after left, if it may run now (b.mu held).
func (b *h2ReqBody) ready() func() {
	if !b.over || b.reading || b.then == nil {
		return nil
	}
	fn := b.then
	b.then = nil
	return fn
}

// h2Body ends its stream's use of the connection at EOF, on error or on
// Close, whichever comes first.
type h2Body struct {
	rc  io.ReadCloser
	end func()
}

func (b *h2Body) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	if err != nil {
		b.end()
	}
	return n, err
}

func (b *h2Body) Close() error {
	err := b.rc.Close()
	b.end()
	return err
}

// h2Exec is a sibling's accepted lease on one of this process's HTTP/2
// connections.
type h2Exec struct {
	n    *Node
	hc   *h2conn
	exec *orbitpool.Execution
}

func (e *h2Exec) maxHeaderBytes() int64 { return e.hc.s.maxHeaderBytes }

// roundTrip runs the sibling's request as a stream. The request read from
// the unix leg names a path only; the connection supplies the scheme, and
// the Host header the authority.
//
// A stream the upstream resets before answering makes x/net close the
// request body and wait for its writer, which may be waiting in the body
// for more from the sibling; a sibling whose caller sends more only once it
// has the response (a bidirectional stream) would then hold both forever.
// So the body's Close stops a pending read (stopBody), unless the response
// has begun: x/net also closes the body of a request answered above 2xx,
// and that answer still goes to the sibling on this stream.
//
// A cancelled RoundTrip returns once the body is closed, and x/net's writer
// may still be in the head's write, blocked by an upstream that stopped
// reading. Once that write ends, the writer reads the body: the accept
// would follow the error frame onto the stream, and the read would take
// the next exchange's bytes. So a failed exchange seals the body first.
func (e *h2Exec) roundTrip(req *http.Request, stopBody func()) (*http.Response, error) {
	req.URL.Scheme = e.hc.scheme
	req.URL.Host = req.Host
	var b *h2OwnerBody
	if stopBody != nil && req.Body != nil && req.Body != http.NoBody {
		b = &h2OwnerBody{ReadCloser: req.Body, stop: stopBody}
		trace := &httptrace.ClientTrace{GotFirstResponseByte: func() { b.responded.Store(true) }}
		req = req.WithContext(httptrace.WithClientTrace(req.Context(), trace))
		req.Body = b
	}
	resp, err := e.n.useH2(e.hc, e.exec, req, nil)
	if err != nil && b != nil {
		b.seal()
	}
	return resp, err
}

// h2OwnerBody is a sibling's request body on the owner, as an HTTP/2
// stream sends it (see h2Exec.roundTrip).
type h2OwnerBody struct {
	io.ReadCloser
	stop      func()
	responded atomic.Bool

	// mu is held by Read, so that seal waits for a Read in progress.
	mu     sync.Mutex
	sealed bool
}

// errBodySealed is what x/net's writer reads from a sibling's body once the
// exchange has failed.
var errBodySealed = errors.New("proxy: the exchange failed; its request body is no longer read")

func (b *h2OwnerBody) Read(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.sealed {
		return 0, errBodySealed
	}
	return b.ReadCloser.Read(p)
}

// seal hands the stream back to the serving goroutine: a Read in progress
// is stopped and waited for, and none starts after.
func (b *h2OwnerBody) seal() {
	b.stop()
	b.mu.Lock()
	b.sealed = true
	b.mu.Unlock()
}

func (b *h2OwnerBody) Close() error {
	if !b.responded.Load() {
		b.stop()
	}
	return b.ReadCloser.Close()
}

func (e *h2Exec) abandon() { e.exec.Complete() }

// acceptH2 is accept for a lease on an HTTP/2 connection. A connection
// that cannot take the stream is refused as gone if it will take none
// again (goneForGood): one merely full (see usableH2) is paused, and has
// room again soon, so it is refused as busy, and the sibling does not keep
// off it for good (see avoided.goneConns).
func (n *Node) acceptH2(hc *h2conn, exec *orbitpool.Execution) (execution, error) {
	if !n.usableH2(hc) {
		exec.Complete()
		if !hc.goneForGood() {
			return nil, &rejectError{code: rejectOverload, err: fmt.Errorf("%w: http2 connection full", ErrOwnerBusy)}
		}
		return nil, &rejectError{code: rejectGone, err: errors.New("http2 connection draining")}
	}
	n.stats.servedRemote.Add(1)
	return &h2Exec{n: n, hc: hc, exec: exec}, nil
}

// sweepH2 follows each HTTP/2 connection's state between streams: a
// SETTINGS or GOAWAY that arrived while nothing ran, an idle timeout the
// ClientConn enforced, a lifetime or cap reached.
func (n *Node) sweepH2() {
	for i := range n.h2slots {
		if hc := n.h2slots[i].Load(); hc != nil {
			n.syncH2Off(hc, n.syncH2Now)
		}
	}
}

// closeIdleH2 closes the HTTP/2 connections with no stream running and no
// unit reserved (retireIdleH2), and, if all, drains the others so they close
// when their last stream ends.
func (n *Node) closeIdleH2(all bool) {
	for i := range n.h2slots {
		hc := n.h2slots[i].Load()
		switch {
		case hc == nil:
		case all:
			n.drainH2(hc)
		case hc.active.Load() == 0:
			if h := testHookCloseIdleH2.Load(); h != nil {
				(*h)(hc)
			}
			n.retireIdleH2(hc)
		}
	}
}

// retireIdleH2 retires hc if nothing in the fleet uses or holds a unit of
// it, as net/http's CloseIdleConnections closes a ClientConn only with no
// stream and no reservation (checked under its lock). A request takes its
// unit in the pool (a local use, or a sibling's reservation, then its lease)
// before its stream starts here, so hc's count of streams alone misses one
// in between, and would drain a connection a stream then runs on. So the
// capacity goes to 0 first: every grant after SetCapacity is given back, a
// retry-safe refusal after which the request plans again (it waits, dials,
// or takes another connection, as for a full one), and the pool's count of
// uses and reservations read next then misses none. A connection found in
// use gets its capacity back. hc.mu orders this with syncH2's changes of
// the capacity.
func (n *Node) retireIdleH2(hc *h2conn) {
	hc.mu.Lock()
	if hc.draining {
		hc.mu.Unlock()
		return
	}
	if err := n.pool.SetCapacity(hc.id, 0); err != nil {
		hc.mu.Unlock()
		if !errors.Is(err, orbitpool.ErrClosed) && !errors.Is(err, orbitpool.ErrStale) {
			n.log.Debug("close idle", zap.Stringer("id", hc.id), zap.Error(err))
		}
		return
	}
	if hc.active.Load() > 0 || n.h2Held(hc) {
		if err := n.pool.SetCapacity(hc.id, hc.capacity); err != nil && !errors.Is(err, orbitpool.ErrClosed) && !errors.Is(err, orbitpool.ErrStale) {
			n.log.Debug("close idle: restore capacity", zap.Stringer("id", hc.id), zap.Error(err))
		}
		hc.mu.Unlock()
		return
	}
	hc.draining = true
	hc.capacity = 0
	hc.mu.Unlock()
	n.retireH2InOrder(hc)
}

// h2Held reports whether a unit of hc is in use or reserved in the pool;
// true too when the pool cannot tell, so that nothing is retired blind.
func (n *Node) h2Held(hc *h2conn) bool {
	cs, err := n.pool.Candidates(hc.key, nil)
	if err != nil {
		return true
	}
	for _, c := range cs {
		if c.ID == hc.id {
			return c.InUse+c.Pending > 0
		}
	}
	return true
}

// testHookCloseIdleH2, set only by tests, runs in closeIdleH2(false) once a
// connection has looked idle, before it is retired: tests start a stream
// there to make the race with a request certain rather than rare.
var testHookCloseIdleH2 atomic.Pointer[func(*h2conn)]

// closeAllH2 closes every HTTP/2 connection at once.
func (n *Node) closeAllH2() {
	for i := range n.h2slots {
		if hc := n.h2slots[i].Load(); hc != nil {
			n.retireH2(hc)
		}
	}
}

// tlsNextProtos is what ALPN offers for u.
func tlsNextProtos(u *upstream) []string {
	if u.Proto == protoHTTP2 {
		return []string{http2.NextProtoTLS, "http/1.1"}
	}
	return []string{"http/1.1"}
}

// createH2 starts HTTP/2 on a connection dialed under permit, registers it
// with the peer's stream limit, one stream in use by its creator, and runs
// req on it. The dial counts in kc (nil for a key without a cap) until it is
// registered or fails.
func (t *Transport) createH2(req *http.Request, e *upstreamEntry, c *conn, permit *orbitpool.CreationPermit, kc *keyCap, release func()) (*http.Response, error) {
	n := t.Node
	dialEnded := sync.OnceFunc(kc.dialEnds)
	defer dialEnded() // a panic out of startH2 included
	cc, capacity, err := t.startH2(req.Context(), &e.u, c)
	if err != nil {
		n.dropPermit(permit)
		return nil, err
	}
	// Siblings woken by the new room may present leases on it before it is
	// installed here: accept waits for the install (awaitH2).
	// A peer that allows no stream yet still gets the creator's, which
	// waits in the ClientConn as x/net/http2 has it wait (see
	// StrictMaxConcurrentStreams); the follower then sets the capacity
	// to the peer's 0.
	capacity = max(capacity, 1)
	n.beginH2Install()
	exec, err := kc.register(permit, capacity, dialEnded)
	if err != nil {
		n.endH2Install()
		n.dropPermit(permit)
		cc.Close()
		return nil, &Error{Op: "register", RetrySafe: true, Err: err}
	}
	scheme := "http"
	if e.u.Scheme == "https" {
		scheme = "https"
	}
	hc, err := n.installH2(exec.ID(), e.key, cc, c, scheme, capacity, &t.settings)
	n.endH2Install()
	if err != nil {
		cc.Close()
		n.pool.Unregister(exec.ID())
		exec.Complete()
		return nil, &Error{Op: "register", RetrySafe: true, Err: err}
	}
	c.watch.follow(n, hc)
	n.stats.created.Add(1)
	n.room.signalKey(e.key, capacity-1, false) // the streams it has room for beside this one
	return n.useH2(hc, exec, req, release)
}
