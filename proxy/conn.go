package proxy

import (
	"bufio"
	"crypto/tls"
	"errors"
	"io"
	"math"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/orbitproxy/orbit/orbitpool"
)

// conn is one HTTP/1.1 client connection on which at most one exchange runs
// at a time. The same type carries both legs: an upstream TCP or TLS
// connection, and a unix stream from this process to an owner process. The
// leg differs only in what the exchange writes before the request and reads
// before each response head (see [leg]).
type conn struct {
	nc  net.Conn
	raw net.Conn // the TCP or unix conn under nc, for CloseWrite and liveness
	lr  limitReader
	cw  countWriter
	br  *bufio.Reader
	bw  *bufio.Writer
	tls *tls.ConnectionState

	watch *h2Watch // reads of an HTTP/2 connection, or nil

	created  time.Time
	idleAt   time.Time // when it last went idle; touched only by whoever holds the conn
	requests int       // exchanges started; touched only by whoever holds the conn
	peek     peeker    // the idle check's look at the socket; touched only by whoever holds the conn

	abortOnce sync.Once
	abortErr  atomic.Pointer[error] // why the conn was torn down mid-exchange
	closed    atomic.Bool

	// peerOwner is, on the unix leg, the incarnation of the owner
	// process the stream was dialed for (see peers.get).
	peerOwner orbitpool.Incarnation

	// lingers: a failed exchange leaves the descriptor open, for its
	// owner to close once the upstream has closed its side (see
	// Node.finish). Set before the conn's first exchange.
	lingers bool
	// full, set with lingers, reports whether the upstream still holds
	// connections the fleet closed before it let them go (see
	// Node.closedEarly): if it closes this one at once, before answering
	// its first request, it is refusing it, at a cap of its own; refused
	// records that (see Node.holdRefused).
	full    func() bool
	refused atomic.Bool
	// relayPaid marks a connection dialed where a sibling's could have
	// served its first request (see upstreamEntry.claimDial). Set before
	// its first exchange.
	relayPaid bool
}

const (
	readBufSize  = 4 << 10
	writeBufSize = 4 << 10
)

func newConn(nc, raw net.Conn) *conn {
	c := &conn{nc: nc, raw: raw, created: time.Now()}
	c.lr = limitReader{r: nc, n: math.MaxInt64}
	c.cw = countWriter{w: nc}
	c.br = bufio.NewReaderSize(&c.lr, readBufSize)
	c.bw = bufio.NewWriterSize(&c.cw, writeBufSize)
	if tc, ok := nc.(*tls.Conn); ok {
		st := tc.ConnectionState()
		c.tls = &st
	}
	return c
}

// abort tears the connection down in the middle of an exchange: every read
// and write blocked on it returns, and err is what the exchange reports.
func (c *conn) abort(err error) {
	c.abortOnce.Do(func() {
		c.abortErr.Store(&err)
		if c.lingers {
			c.nc.SetDeadline(aLongTimeAgo)
			return
		}
		c.close()
	})
}

// aborted returns the error abort was given, or nil.
func (c *conn) aborted() error {
	if p := c.abortErr.Load(); p != nil {
		return *p
	}
	return nil
}

func (c *conn) close() {
	if c.closed.CompareAndSwap(false, true) {
		if c.tlsTorn() {
			c.raw.Close()
			return
		}
		c.nc.Close()
	}
}

// tlsTorn reports whether c is a TLS connection an exchange tore down (see
// abort). crypto/tls sends close_notify on CloseWrite and Close, with a
// write deadline of its own of 5s: behind a request the upstream stopped
// reading, the alert waits that long, and the connection, and its unit of
// the key's budget, with it. Such a connection gets its socket's half-close
// and close instead, at once.
func (c *conn) tlsTorn() bool { return c.raw != c.nc && c.aborted() != nil }

// halfClose tells the peer this side is done writing, and returns what to
// read the peer's own close from: close_notify under TLS, else the socket's
// half-close, which is also what a TLS connection gets when its write was
// torn down (see abort and tlsTorn) or its alert cannot go.
func (c *conn) halfClose() (src net.Conn, err error) {
	if !c.tlsTorn() {
		if err = closeWrite(c.nc); err == nil || c.raw == c.nc {
			return c.nc, err
		}
	}
	return c.raw, closeWrite(c.raw)
}

// maxCloseDrain bounds what closeAfterPeer reads: the rest of a large
// response a failed exchange left is not worth reading, and closing with it
// unread resets the connection, which stops the upstream sending it.
const maxCloseDrain = 256 << 10

// closeAfterPeer half-closes the connection and reads, discarding it, what
// the peer still sends until the peer closes its side too, at most d, and at
// most closeWait more once stop is closed (nil: never); then it closes the
// connection. It reports whether the peer closed. A peer that sends more
// than maxCloseDrain meanwhile is reset, and the wait runs its course: the
// peer may count the connection until it has read the reset.
func (c *conn) closeAfterPeer(d time.Duration, stop <-chan struct{}) bool {
	peerClosed := false
	src, err := c.halfClose()
	if err == nil {
		deadline := time.Now().Add(d)
		c.nc.SetReadDeadline(deadline)
		if stop != nil {
			done := make(chan struct{})
			defer close(done)
			go func() {
				select {
				case <-stop:
					if t := time.Now().Add(closeWait); t.Before(deadline) {
						c.nc.SetReadDeadline(t)
					}
				case <-done:
				}
			}()
		}
		// One byte past the bound tells a peer that closed right after
		// it from one that sends more.
		_, err := io.CopyN(io.Discard, src, maxCloseDrain+1)
		// A TLS peer sends close_notify before it closes the socket: wait for the socket.
		if err == io.EOF && src != c.raw {
			_, err = io.CopyN(io.Discard, c.raw, maxCloseDrain+1)
		}
		// A reset is the peer's close too: it has let the connection go.
		peerClosed = err == io.EOF || errors.Is(err, syscall.ECONNRESET)
		if err == nil {
			c.close()
			t := time.NewTimer(time.Until(deadline))
			select {
			case <-t.C:
			case <-stop:
				time.Sleep(min(closeWait, time.Until(deadline)))
			}
			t.Stop()
		}
	} else {
		// The peer reset the connection already: it has let it go.
		peerClosed = errors.Is(err, syscall.ENOTCONN) || isConnClosed(err)
	}
	c.close()
	return peerClosed
}

// closeWrite half-closes the connection's write side.
func (c *conn) closeWrite() error { return closeWrite(c.nc) }

// limitReader caps how many bytes a response header may take. The exchange
// sets n before reading a head and lifts it for the body, like net/http.
type limitReader struct {
	r io.Reader
	n int64
	// ahead, if any, is read before r: bytes of the stream already read
	// from it (see readPastBuffer).
	ahead []byte
}

var errHeaderLimit = errors.New("header limit reached")

func (l *limitReader) Read(p []byte) (int, error) {
	if l.n <= 0 {
		return 0, errHeaderLimit
	}
	if int64(len(p)) > l.n {
		p = p[:l.n]
	}
	if len(l.ahead) > 0 {
		n := copy(p, l.ahead)
		if l.ahead = l.ahead[n:]; len(l.ahead) == 0 {
			l.ahead = nil
		}
		l.n -= int64(n)
		return n, nil
	}
	n, err := l.r.Read(p)
	l.n -= int64(n)
	return n, err
}

// countWriter counts bytes the kernel accepted, so that a failed exchange can
// tell whether anything of the request could have reached the peer.
type countWriter struct {
	w io.Writer
	n atomic.Int64
	// bufs is how many exchange buffers the exchange under way was granted;
	// set by whoever holds the conn before the exchange starts.
	bufs int
	// failed is set once a write to the peer failed: a request write that
	// failed without it failed for its body.
	failed atomic.Bool
}

// Write counts p before it goes and takes back what did not: whoever finds
// the peer gone while the write is under way (the response reader) must not
// take bytes that may already have reached it for nothing written, which
// would let any request, a POST too, be sent again.
func (c *countWriter) Write(p []byte) (int, error) {
	c.n.Add(int64(len(p)))
	n, err := c.w.Write(p)
	if n < len(p) {
		c.n.Add(int64(n - len(p)))
	}
	if err != nil {
		c.failed.Store(true)
	}
	return n, err
}

// ReadFrom lets a request body go out in large writes: the bufio.Writer in
// front hands a body to it once its own 4 KiB are flushed, and would
// otherwise send the body 4 KiB per system call. The buffer, as many
// exchange buffers as the exchange's budget granted, is borrowed for the
// copy only, so an idle connection stays small.
func (c *countWriter) ReadFrom(r io.Reader) (int64, error) {
	bp := getCopyBuf(c.bufs)
	defer putCopyBuf(bp)
	return io.CopyBuffer(struct{ io.Writer }{c}, r, *bp)
}
