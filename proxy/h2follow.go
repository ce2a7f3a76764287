package proxy

import (
	"net"
	"sync"
	"sync/atomic"
)

// Following a peer's SETTINGS as they arrive. x/net/http2 applies a SETTINGS
// frame (and a GOAWAY) in its connection's read loop, and offers no hook for
// it. What a read loop does offer is its reads: it asks the socket for bytes
// only once it has processed every frame it holds (its bufio.Reader, and
// crypto/tls under it, read the socket only when empty). So every read of the
// socket first wakes the node's follower for the connection, which has the
// ClientConn's state read (on a goroutine of its own, one at a time per
// connection: see syncH2) and the pool told of a changed stream limit (or
// the connection drained on GOAWAY). The pool's capacity thus follows a SETTINGS frame before the
// read loop waits for anything after it, plus one wake-up of the follower;
// it does not wait for a stream to start or end or for the sweep, so a
// connection whose long-lived streams never end is followed too.
//
// Grants taken between x/net applying the lower limit and the follower's
// SetCapacity can exceed it. Such a stream does not fail and does not reach
// the connection early: with StrictMaxConcurrentStreams the ClientConn holds
// it until a stream ends, so the connection never carries more streams than
// the peer allows once it has applied (and acknowledged) the SETTINGS.
//
// The read loop never blocks on the follower: it sets a flag and, if that
// flag was clear, offers the connection to a buffered channel without
// waiting. A full channel leaves the change to the next read, stream end or
// sweep.

// h2Watch is the socket under an HTTP/2 connection's read loop (under TLS
// for h2, so that x/net/http2 keeps its *tls.Conn). Until the connection is
// installed it only reads.
type h2Watch struct {
	net.Conn
	n  atomic.Pointer[Node]
	hc atomic.Pointer[h2conn]

	// ended is closed once the read loop is done with the socket: a read
	// failed (readEnded: the peer closed its side, most often), or the
	// ClientConn closed it. A retirement in good order waits for it (see
	// Node.retireH2InOrder), and then closes the socket itself: retiring
	// keeps the ClientConn's close from closing it first.
	ended     chan struct{}
	endOnce   sync.Once
	readEnded atomic.Bool
	retiring  atomic.Bool
}

func newH2Watch(raw net.Conn) *h2Watch {
	return &h2Watch{Conn: raw, ended: make(chan struct{})}
}

func (w *h2Watch) Read(p []byte) (int, error) {
	if hc := w.hc.Load(); hc != nil {
		w.n.Load().noteH2(hc)
	}
	n, err := w.Conn.Read(p)
	if err != nil {
		w.readEnded.Store(true)
		w.end()
	}
	return n, err
}

func (w *h2Watch) Close() error {
	w.end()
	if w.retiring.Load() {
		return nil
	}
	return w.Conn.Close()
}

func (w *h2Watch) end() { w.endOnce.Do(func() { close(w.ended) }) }

// follow makes every read from now on wake n's follower for hc, and wakes it
// once: SETTINGS may have arrived between the state startH2 read and now.
func (w *h2Watch) follow(n *Node, hc *h2conn) {
	if w == nil {
		return
	}
	w.n.Store(n)
	w.hc.Store(hc)
	n.noteH2(hc)
}

// h2WakeQueue bounds the connections waiting for the follower.
const h2WakeQueue = 256

// noteH2 asks the follower to look at hc, unless it is asked already.
func (n *Node) noteH2(hc *h2conn) {
	if !hc.noted.CompareAndSwap(false, true) {
		return
	}
	select {
	case n.h2wake <- hc:
	default:
		hc.noted.Store(false)
	}
}

// h2follower looks at each connection it is woken for: the flag is cleared
// before the state is read, so a read after that wakes it again and no
// change is missed.
func (n *Node) h2follower() {
	defer n.wg.Done()
	for {
		select {
		case <-n.stop:
			return
		case hc := <-n.h2wake:
			hc.noted.Store(false)
			// On a goroutine of its own: reading the state may wait
			// for a blocked write (see syncH2), which must not hold
			// up the other connections' wake-ups.
			n.syncH2Off(hc, n.followH2)
		}
	}
}

// followH2 is syncH2Now for the follower: the cheap comparison first, since
// it runs for every read of the socket. It runs as the one read of hc's
// state in flight (see syncH2).
func (n *Node) followH2(hc *h2conn) {
	if n.lookupH2(hc.id) != hc {
		return
	}
	st := hc.cc.State()
	if !st.Closed && !st.Closing {
		hc.mu.Lock()
		same := hc.draining || streamCapacity(st.MaxConcurrentStreams) == hc.capacity
		hc.mu.Unlock()
		if same {
			return
		}
	}
	n.stats.followed.Add(1)
	n.syncH2Now(hc)
}
