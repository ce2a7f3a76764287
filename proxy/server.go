package proxy

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/http/httputil"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/orbitproxy/orbit/backpressure"
	"github.com/orbitproxy/orbit/governor"
)

// acceptor turns a remote lease into the right to use one of this process's
// upstream connections. The Transport implements it over the pool; tests use
// fakes.
type acceptor interface {
	// accept takes up a lease whose request waited on this owner for
	// waited (for a worker): the key's wait, served or refused.
	accept(lease []byte, waited time.Duration) (execution, error)
}

// execution is one accepted lease: a request may be sent on the leased
// connection exactly once, or the execution abandoned. Either way it
// completes itself, which is what gives the capacity back.
type execution interface {
	// maxHeaderBytes is the header limit of the Transport that made the
	// connection, which bounds the request head the owner reads for it
	// (see peerHeadLimit).
	maxHeaderBytes() int64
	// roundTrip runs req; stopBody makes a pending read of its body return.
	roundTrip(req *http.Request, stopBody func()) (*http.Response, error)
	abandon()
}

// leaseDropper is implemented by an acceptor that can give a lease's
// capacity back without serving it (Node.drop), counting the time its
// request waited on the owner (waited) as the key's wait.
type leaseDropper interface {
	drop(lease []byte, waited time.Duration)
}

// bufSetter is implemented by an execution that uses as many exchange
// buffers as its budget granted.
type bufSetter interface{ setBufs(k int) }

// rejectError is what an acceptor returns to refuse a lease with a reason.
type rejectError struct {
	code uint16
	err  error
}

func (e *rejectError) Error() string { return e.err.Error() }
func (e *rejectError) Unwrap() error { return e.err }

// server is the owner's side of the unix leg: it accepts leases from sibling
// processes and runs their requests on its own upstream connections,
// streaming the responses back.
type server struct {
	ln  *net.UnixListener
	acc acceptor
	log *zap.Logger

	// gov, if set, is the process's budget: a sibling's exchange holds a
	// worker of it, waited for no longer than maxLeaseWait and no later
	// than the frame's deadline less near. adm, if set, is the admission
	// backstop, asked with the siblings' exchanges running here.
	gov          *governor.Governor
	adm          *governor.Admission
	near         time.Duration
	maxLeaseWait time.Duration
	// refused counts rejected leases by refuseReasons index.
	refused [len(refuseReasons)]atomic.Uint64

	watcher watcher

	// draining refuses new leases, retry-safe, while active exchanges
	// finish: see Node.Shutdown. leasing ends with it, or when the server
	// closes: a sibling's request waiting for a worker is refused then
	// too, rather than when its wait runs out (holding Shutdown up).
	draining  atomic.Bool
	leasing   context.Context
	endLeases context.CancelFunc
	active    atomic.Int64
	// spliced counts siblings' response bodies moved with splice(2).
	spliced atomic.Uint64

	// maxIdlePerPeer caps the streams of one peer process waiting for
	// their next frame: what a sibling keeps idle costs a goroutine and a
	// descriptor here, and a sibling must not make us hold without bound.
	maxIdlePerPeer int

	mu sync.Mutex
	// conns are the open streams, each true while it carries an
	// exchange (see exchanging).
	conns      map[net.Conn]bool
	idleByPeer map[int32]int
	closed     bool
	wg         sync.WaitGroup
}

// peerHeadTimeout is how long a peer may take to send a request head, and a
// new stream its first frame, when its frame names no earlier deadline. A
// sibling writes both at once; one that does not costs a timer, not a leased
// upstream connection held without end.
const peerHeadTimeout = 10 * time.Second

func newServer(ln *net.UnixListener, acc acceptor, log *zap.Logger) *server {
	if log == nil {
		log = zap.NewNop()
	}
	leasing, endLeases := context.WithCancel(context.Background())
	return &server{ln: ln, acc: acc, log: log, conns: make(map[net.Conn]bool),
		idleByPeer: make(map[int32]int), maxIdlePerPeer: 2 * defaultMaxIdlePeerConns,
		maxLeaseWait: defaultMaxLeaseWait, leasing: leasing, endLeases: endLeases}
}

// drain refuses new leases from now on, and those waiting for a worker.
func (s *server) drain() {
	s.draining.Store(true)
	s.endLeases()
}

// serve accepts peers until the listener closes.
func (s *server) serve() error {
	for {
		c, err := s.ln.AcceptUnix()
		if err != nil {
			s.mu.Lock()
			closed := s.closed
			s.mu.Unlock()
			if closed {
				return ErrClosed
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			if errors.Is(err, net.ErrClosed) {
				return ErrClosed
			}
			s.log.Warn("accept failed", zap.Error(err))
			time.Sleep(10 * time.Millisecond)
			continue
		}
		pid, err := checkPeer(c)
		if err != nil {
			s.log.Warn("peer refused", zap.Error(err))
			c.Close()
			continue
		}
		if !s.track(c, true) {
			lastWord(c, leavingFrame)
			c.Close()
			return ErrClosed
		}
		go func() {
			defer s.wg.Done()
			defer s.track(c, false)
			defer c.Close()
			defer func() {
				// The exchange's own recovery points have given its
				// connection back; what is left is this stream, which
				// the deferred Close ends.
				if p := recover(); p != nil {
					recovered(s.log, "peer stream", p)
				}
			}()
			s.serveConn(c, pid)
		}()
	}
}

// track adds c to the open streams, and to those close waits for (under mu,
// so that the Add comes before close's Wait), unless the server is closed;
// or takes it out.
func (s *server) track(c net.Conn, add bool) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if add {
		if s.closed {
			return false
		}
		s.conns[c] = false
		s.wg.Add(1)
	} else {
		delete(s.conns, c)
	}
	return true
}

// leavingFrame is that refusal.
var leavingFrame = appendResponseFrame(nil, responseFrame{typ: frameReject, code: rejectClosing, msg: errOwnerLeaving.Error()})

// idleCapGrace is how long a stream over its peer's cap of idle streams
// may take to bring its next frame before it is closed (see serveConn).
const idleCapGrace = 100 * time.Millisecond

// idleCapFrame is the refusal a stream over its peer's idle cap gets as it
// closes (see serveConn).
var idleCapFrame = appendResponseFrame(nil, responseFrame{typ: frameReject, code: rejectOverload,
	msg: "owner busy: too many idle streams from one peer"})

// lastWord writes frame to c, the last thing c carries before it closes, if
// the socket takes it at once. It waits for nothing: not for room in a
// stream whose peer reads nothing, not for a write blocked there (the fd is
// written directly, without the Conn's write lock), and not on a clock,
// which a close slowed by a loaded machine would run out for every stream
// after the first. A frame this small goes whole into a unix stream or not
// at all, so it cannot land inside another writer's frame either.
func lastWord(c net.Conn, frame []byte) {
	if rc := socketOf(c); rc != nil {
		rc.Control(func(fd uintptr) {
			unix.Write(int(fd), frame)
		})
	}
}

// refuseQueued shuts the socket to new streams, then accepts the streams
// queued on it, without blocking, and refuses and closes each. A sibling's
// dial is queued or refused (ECONNREFUSED: it goes elsewhere, as from an
// owner gone) under the socket's lock, so no stream can queue after the
// accepts have looked, to be reset by the close, its request lost.
func (s *server) refuseQueued() {
	rc, err := s.ln.SyscallConn()
	if err != nil {
		return
	}
	rc.Control(func(fd uintptr) {
		unix.Shutdown(int(fd), unix.SHUT_RD)
		for {
			nfd, _, err := unix.Accept4(int(fd), unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK)
			if err != nil {
				return // EAGAIN: none left
			}
			unix.Write(nfd, leavingFrame)
			unix.Close(nfd)
		}
	})
}

// close stops accepting, closes every peer stream and waits for their
// goroutines; exchanges under way are cancelled, and answer their peers
// with an error, retry-safe if they had sent nothing upstream.
func (s *server) close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	// A stream whose exchange ends in closeGrace (below) may bring another
	// frame: refused, as a draining server's.
	s.draining.Store(true)
	// A request a peer sent on a stream that carries no exchange (see
	// exchanging) will never reach the upstream, drained or not (one read
	// and waiting for a worker, too): it is refused, unasked, before its
	// stream goes, so that the peer sends it elsewhere instead of losing
	// it with the stream (it cannot tell whether a lost one was acted on).
	// That goes for the streams still queued on the socket too, which
	// closing it would reset. A peer drops a stream once refused as
	// closing. A stream carrying an exchange (a drain that timed out, or
	// none) is cancelled, and gets a moment (closeGrace) to answer before
	// its stream closes: one that had sent nothing upstream says so, and
	// its peer sends the request elsewhere; closed under it, the stream
	// would leave the peer unable to tell, with a request it may not send
	// twice. Then every stream closes, refused if it carries none.
	//
	// The socket's name goes first, so that new dials fail at once, and
	// the close cannot remove a name another process has bound since.
	s.ln.SetUnlinkOnClose(false)
	if err := os.Remove(s.ln.Addr().String()); err != nil && !errors.Is(err, os.ErrNotExist) {
		s.log.Warn("socket not removed", zap.Error(err))
	}
	s.refuseQueued()
	err := s.ln.Close()
	busy := s.closeStreams(false)
	s.mu.Unlock()
	s.endLeases()
	s.watcher.cancelAll()
	for end := time.Now().Add(closeGrace); busy && time.Now().Before(end); {
		time.Sleep(time.Millisecond)
		s.mu.Lock()
		busy = s.closeStreams(false)
		s.mu.Unlock()
	}
	s.mu.Lock()
	s.closeStreams(true)
	s.mu.Unlock()
	s.wg.Wait()
	return err
}

// closeGrace is how long close waits for the exchanges it cancelled to
// answer their peers.
const closeGrace = 100 * time.Millisecond

// closeStreams refuses and closes the streams that carry no exchange, and
// the others too if all; it reports whether it left any open. s.mu is held.
func (s *server) closeStreams(all bool) (left bool) {
	for c, busy := range s.conns {
		if busy && !all {
			left = true
			continue
		}
		if !busy {
			lastWord(c, leavingFrame)
		}
		c.Close()
	}
	return left
}

// idle marks a stream of peer pid as waiting for its next frame, or done
// waiting. It refuses a stream that would take the peer past its cap.
func (s *server) idle(pid int32, enter bool) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !enter {
		if s.idleByPeer[pid]--; s.idleByPeer[pid] <= 0 {
			delete(s.idleByPeer, pid)
		}
		return true
	}
	if s.idleByPeer[pid] >= s.maxIdlePerPeer {
		return false
	}
	s.idleByPeer[pid]++
	return true
}

// serveConn runs one peer's persistent stream: frame, request, response, and
// again, until the peer goes, a message cannot be framed, or an exchange
// leaves the stream out of step.
func (s *server) serveConn(nc *net.UnixConn, pid int32) {
	cr := &bgReader{nc: nc}
	cr.cond.L = &cr.mu
	lr := &limitReader{r: cr, n: math.MaxInt64}
	br := bufio.NewReaderSize(lr, readBufSize)
	bw := bufio.NewWriterSize(nc, writeBufSize)
	wait := peerHeadTimeout // a new stream comes with its first frame
	between := betweenExchanges.Load()
	// One frame for the stream's life: an exchange keeps a pointer to it,
	// which would otherwise cost an allocation per frame.
	var f requestFrame
	for {
		// A stream over the peer's cap of idle streams gets a moment to
		// bring its next frame, as one between two exchanges of a burst
		// does at once; it does not count, and then it goes.
		counted := s.idle(pid, true)
		d := wait
		if !counted {
			d = min(d, idleCapGrace)
		}
		// The deadline stays until readPeerHead replaces it: nothing
		// reads the stream before then, and every exchange, refused or
		// not, reads its request head.
		nc.SetReadDeadline(time.Now().Add(d))
		var err error
		f, err = readFrame(br, reqHeaderLen, decodeRequestFrame)
		hopMark(hopToOwner)
		if counted {
			s.idle(pid, false)
		}
		wait = 2 * peerIdleTimeout
		if err != nil {
			switch {
			case !counted && errors.Is(err, os.ErrDeadlineExceeded):
				s.log.Info("peer stream closed: too many idle streams from one peer",
					zap.Int32("pid", pid), zap.Int("max", s.maxIdlePerPeer))
				// The peer may be sending its next frame on it: refused,
				// unasked, the request goes elsewhere, as on a draining
				// owner's streams (see close), rather than be lost with
				// the stream, which would leave the peer unable to tell
				// whether it was acted on.
				lastWord(nc, idleCapFrame)
			case errors.Is(err, io.EOF), errors.Is(err, net.ErrClosed), errors.Is(err, os.ErrDeadlineExceeded):
				// The peer left, we are closing, or the stream sat idle.
			default:
				s.log.Info("peer stream closed", zap.Error(err))
			}
			return
		}
		if !s.serveOne(nc, cr, lr, br, bw, &f) {
			// Out of step: the stream closes still marked as carrying
			// an exchange, so that close writes no refusal into it,
			// where the peer may be reading a body.
			return
		}
		if between != nil {
			(*between)()
		}
	}
}

// betweenExchanges, if set, runs on a stream after each exchange that left
// it in step. Tests use it to stop a stream there; it is read once per
// stream.
var betweenExchanges atomic.Pointer[func()]

// testHookExchanging, if set, runs as a sibling's exchange begins, before
// anything of it goes upstream, with the exchange's context.
var testHookExchanging atomic.Pointer[func(context.Context)]

// exchanging marks stream c as carrying an exchange that may reach the
// upstream, unless the server is closed, or done with it. close refuses
// only the streams that carry none, such as one whose request waits for a
// worker: an exchange under way may have reached the upstream, and its peer
// must see it fail, not a refusal that it would take as leave to send it
// again.
func (s *server) exchanging(c net.Conn, on bool) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if on && s.closed {
		return false
	}
	s.conns[c] = on
	return true
}

// reject answers a frame with a refusal and reports whether the stream can
// carry another exchange. A caller that holds its body back until the owner
// accepts (flagBodyOnAccept) sent only the head, which is read past; one
// that sent a short body in full with its head sent that too, which is read
// past as well. Any other body would mean reading what nobody wants, so
// that stream ends.
func (s *server) reject(nc net.Conn, lr *limitReader, br *bufio.Reader, bw *bufio.Writer, f *requestFrame, code uint16, err error) bool {
	s.refused[refuseReason(code, err)].Add(1)
	bw.Write(appendResponseFrame(nil, responseFrame{typ: frameReject, code: code, msg: err.Error()}))
	// A peer that reads none of its refusals (and pipelines more frames)
	// costs this stream's goroutine no longer than a silent one does.
	nc.SetWriteDeadline(time.Now().Add(peerHeadTimeout))
	if bw.Flush() != nil {
		return false
	}
	nc.SetWriteDeadline(time.Time{})
	req, err := readPeerHead(nc, lr, br, time.Time{}, defaultMaxHeaderBytes)
	if err != nil {
		return false
	}
	if f.flags&flagBodyOnAccept != 0 {
		return true
	}
	body, err := readBodyWithHead(nc, br, f, req, time.Time{})
	return body != nil && err == nil
}

// refuseHead tells the peer, in an error frame, why its request head was
// refused (over the header limit, or not a request), before the stream
// closes under the rest of it. Without it a sibling whose write fails as the
// stream closes sees only a closed stream, takes its owner for gone, avoids
// it, and may wait on the pool for the rest of its deadline when that
// owner's connection was the only one. Nothing went upstream, but the error
// is not retry-safe: any owner would refuse the same head, as a server
// answers it 431 or 400. The peer's unread bytes are not read: the frame is
// in the stream before the close that fails the peer's write, and the
// sibling reads it then (see exchange.ownerAnswer). Its code (see
// headRefused) tells a sibling whose write went through that the stream
// ends here, unlike other refusals.
func refuseHead(nc net.Conn, err error) {
	lastWord(nc, appendResponseFrame(nil, responseFrame{typ: frameError, code: errCode(err), msg: err.Error()}))
}

// readBodyWithHead reads the short body that a frame without
// flagBodyOnAccept carries after its head (see withBodyAhead), within
// peerHeadTimeout or by deadline if that is sooner, and returns it; nil if
// the frame carries none. The owner reads it before it answers anything, so
// that the stream stays in step whatever the answer, and the caller, which
// does not wait for an accept, is never left writing to a stream closed
// under it.
func readBodyWithHead(nc net.Conn, br *bufio.Reader, f *requestFrame, req *http.Request, deadline time.Time) ([]byte, error) {
	if f.flags&(flagBodyOnAccept|flagLength) != 0 || req.ContentLength <= 0 || req.ContentLength > maxBodyWithHead {
		return nil, nil
	}
	if int64(br.Buffered()) < req.ContentLength {
		by := time.Now().Add(peerHeadTimeout)
		if !deadline.IsZero() && deadline.Before(by) {
			by = deadline
		}
		nc.SetReadDeadline(by)
		defer nc.SetReadDeadline(deadline)
	}
	b := make([]byte, req.ContentLength)
	if _, err := io.ReadFull(req.Body, b); err != nil {
		return nil, err
	}
	return b, nil
}

// peerChunkedBody reads a sibling's chunked request body from the stream,
// and at its end the trailers, bounded as the head is. net/http's reader of
// a chunked body takes trailers only up to its read buffer (4 KiB here,
// "suspiciously long trailer"), where a local exchange sends them whole and
// x/net/http2's server takes them up to its header limit.
type peerChunkedBody struct {
	cr    io.Reader // the chunked body's data, up to its last chunk
	br    *bufio.Reader
	lr    *limitReader
	limit int64
	req   *http.Request // whose trailers the exchange's writer sends
	err   error         // once the body has ended, or failed
}

func (b *peerChunkedBody) Read(p []byte) (int, error) {
	if b.err != nil {
		return 0, b.err
	}
	n, err := b.cr.Read(p)
	if err == io.EOF {
		err = b.readTrailers()
	}
	b.err = err
	return n, err
}

// readTrailers reads the trailer section after the last chunk into the
// request's trailers, putting back the fields the sibling wrapped (see
// wrapRequest), and returns io.EOF, or why it cannot. Nothing of a section
// it cannot read goes upstream.
func (b *peerChunkedBody) readTrailers() error {
	h, over, err := readFieldBlock(b.br, b.lr, b.limit+int64(b.br.Size()))
	switch {
	case over:
		return fmt.Errorf("request trailers over the owner's limit of %d bytes", b.limit)
	case err != nil:
		return fmt.Errorf("request trailers: %w", err)
	}
	if err := unwrapPadded(h); err != nil {
		return fmt.Errorf("request trailers: %w", err)
	}
	setFields(&b.req.Trailer, h)
	return io.EOF
}

// Close does not close the peer stream: the body is a window on it.
func (b *peerChunkedBody) Close() error { return nil }

// readPeerHead reads a request head from a peer, bounded in size by limit
// (what br had read ahead aside) and in time by deadline, or peerHeadTimeout
// if that is sooner or deadline is zero. It leaves deadline as the stream's
// read deadline, for the body: past it the caller has given up.
//
// A sibling writes the frame and the head at once, so the head is usually
// in br already: then parsing it reads nothing from the stream, and the
// head's own deadline, a timer change on the hot path, is not needed.
func readPeerHead(nc net.Conn, lr *limitReader, br *bufio.Reader, deadline time.Time, limit int64) (*http.Request, error) {
	if !headBuffered(br) {
		headBy := time.Now().Add(peerHeadTimeout)
		if !deadline.IsZero() && deadline.Before(headBy) {
			headBy = deadline
		}
		nc.SetReadDeadline(headBy)
	}
	// The limit is a head's as its caller wrote it: fields that crossed in
	// paddedField make it longer, up to about twice for any head an
	// HTTP/1.1 or HTTP/2 server lets through, and are counted as they were.
	allowed := limit + int64(br.Size())
	start := br.Buffered()
	lr.n = 2 * allowed
	req, err := http.ReadRequest(br)
	if err != nil && lr.n <= 0 {
		// Cut at the bound, the head's last line may read as malformed.
		err = errHeaderLimit
	}
	size := int64(start) + 2*allowed - lr.n - int64(br.Buffered())
	lr.n = math.MaxInt64
	nc.SetReadDeadline(deadline)
	if err == nil && size-wrapGrowth(req.Header[paddedField]) > allowed {
		err = errHeaderLimit
	}
	if err == nil {
		err = unwrapPadded(req.Header)
	}
	return req, err
}

// awaitHead waits, bounded as readPeerHead's read is, until br holds the
// request head's end, and with withBody the short body a frame without
// flagBodyOnAccept carries after its head (see readBodyWithHead); what the
// read buffer has no room for is read ahead of it (see readPastBuffer), up
// to maxHeadAhead (a larger head is read as it comes). Only then are the
// worker and the lease taken up: a peer that sends half a head, or half the
// body it promised with the head, and stalls costs its stream's goroutine,
// not an upstream connection, as a client's half-sent head costs Caddy's
// server no upstream connection.
func awaitHead(nc net.Conn, lr *limitReader, br *bufio.Reader, deadline time.Time, withBody bool) error {
	if requestBuffered(br, withBody) {
		return nil
	}
	headBy := time.Now().Add(peerHeadTimeout)
	if !deadline.IsZero() && deadline.Before(headBy) {
		headBy = deadline
	}
	nc.SetReadDeadline(headBy)
	defer nc.SetReadDeadline(deadline)
	for n := br.Buffered(); n < br.Size(); n = br.Buffered() {
		if _, err := br.Peek(n + 1); err != nil {
			return err
		}
		if requestBuffered(br, withBody) {
			return nil
		}
	}
	return readPastBuffer(nc, lr, br, withBody)
}

// maxHeadAhead bounds what awaitHead reads into memory past the full read
// buffer before a worker and the lease are taken up: a head that does not
// end within it (over 64 KiB, far past what browsers and nginx's default
// large_client_header_buffers send) is read as it comes, once they are.
const maxHeadAhead = 64 << 10

// readPastBuffer is awaitHead's wait once the read buffer is full: what it
// has no room for, up to the head's end and, with withBody, the short body
// (a short body may be as long as the buffer), bounded by maxHeadAhead, is
// read into lr.ahead, which lr serves before the stream's next bytes. It
// reads exactly those bytes, found with MSG_PEEK, and nothing the peer sent
// after them, which the watch of the exchange reads from the stream itself.
// They are read, not left in the socket: each write of the peer is charged
// to it there whole until read, and a peer gone is seen when they are.
func readPastBuffer(nc net.Conn, lr *limitReader, br *bufio.Reader, withBody bool) error {
	b, _ := br.Peek(br.Buffered())
	got := append(make([]byte, 0, 2*len(b)), b...)
	buf := make([]byte, readBufSize)
	for {
		missing, head := shortBodyMissing(got)
		if head && (!withBody || missing == 0) || !head && len(got) >= maxHeadAhead {
			break
		}
		q, ok, err := peekQueued(nc, buf)
		if !ok {
			break // not a socket: read as it comes
		}
		if err != nil {
			return err
		}
		take := q
		if head {
			take = min(q, missing)
		} else {
			// Up to the head's end, if it is among them: the end may
			// begin in what got holds.
			k := max(len(got)-(len(crlfcrlf)-1), 0)
			tail := append(got[k:len(got):len(got)], buf[:q]...)
			if i := bytes.Index(tail, crlfcrlf); i >= 0 {
				take = i + len(crlfcrlf) - (len(got) - k)
			}
			take = min(take, maxHeadAhead-len(got))
		}
		at := len(got)
		got = append(got, make([]byte, take)...)
		if _, err := io.ReadFull(lr.r, got[at:]); err != nil {
			return err
		}
	}
	if len(got) > len(b) {
		lr.ahead = got[len(b):]
	}
	return nil
}

// headBuffered reports whether br holds the end of a request head, so that
// reading the head needs no more bytes from the stream: the head ends at
// its first empty line, which is at or before the first CRLF CRLF.
func headBuffered(br *bufio.Reader) bool {
	b, _ := br.Peek(br.Buffered())
	return bytes.Contains(b, crlfcrlf)
}

// requestBuffered is headBuffered, and with withBody also the short body
// that the head declares with its Content-Length (see shortBodyLen).
func requestBuffered(br *bufio.Reader, withBody bool) bool {
	if !withBody {
		return headBuffered(br)
	}
	b, _ := br.Peek(br.Buffered())
	missing, head := shortBodyMissing(b)
	return head && missing == 0
}

// shortBodyMissing reports whether b holds the end of a request head, and
// how many bytes of the short body that head declares (see shortBodyLen) b
// does not hold yet.
func shortBodyMissing(b []byte) (missing int, head bool) {
	i := bytes.Index(b, crlfcrlf)
	if i < 0 {
		return 0, false
	}
	return max(shortBodyLen(b[:i+2])-(len(b)-(i+len(crlfcrlf))), 0), true
}

// shortBodyLen is the length of the body that readBodyWithHead reads after
// head (its lines, each ending in CRLF): its Content-Length, if that is at
// most maxBodyWithHead and no Transfer-Encoding goes with it; 0 otherwise.
// It only tells awaitHead how long to wait: the head is parsed, and the body
// read, as before.
func shortBodyLen(head []byte) int {
	n := 0
	for len(head) > 0 {
		line, rest, _ := bytes.Cut(head, []byte("\n"))
		head = rest
		name, v, ok := bytes.Cut(line, []byte(":"))
		if !ok {
			continue
		}
		switch {
		case bytes.EqualFold(name, []byte("Transfer-Encoding")):
			return 0
		case bytes.EqualFold(name, []byte("Content-Length")):
			k, err := strconv.ParseInt(string(bytes.TrimSpace(v)), 10, 64)
			if err != nil || k <= 0 || k > maxBodyWithHead {
				return 0
			}
			n = int(k)
		}
	}
	return n
}

var crlfcrlf = []byte("\r\n\r\n")

func rejectCode(err error) uint16 {
	var re *rejectError
	if errors.As(err, &re) {
		return re.code
	}
	return rejectUnknown
}

// refuseReasons label the owner's lease refusals in NodeStats.RefusedBy.
var refuseReasons = [...]string{"other", "stale", "deadline", "gone", "closing", "busy", "admission"}

const (
	refuseOther = iota
	refuseStale
	refuseDeadline
	refuseGone
	refuseClosing
	refuseBusy
	refuseAdmission
)

func refuseReason(code uint16, err error) int {
	switch {
	case errors.Is(err, ErrNotAdmitted):
		return refuseAdmission
	case code == rejectOverload && errors.Is(err, ErrOwnerBusy):
		return refuseBusy
	}
	switch code {
	case rejectStale:
		return refuseStale
	case rejectDeadline:
		return refuseDeadline
	case rejectGone:
		return refuseGone
	case rejectClosing:
		return refuseClosing
	}
	return refuseOther
}

// defaultMaxLeaseWait is NodeOptions.MaxLeaseWait's default: half the pool's
// default reservation timeout, so that a lease the owner cannot serve is
// rejected well before the pool would age it out.
const defaultMaxLeaseWait = 500 * time.Millisecond

// refuseLease rejects a lease this process will not serve and gives its
// capacity back at once, so that the reservation does not wait for the pool
// to age it out.
func (s *server) refuseLease(nc net.Conn, lr *limitReader, br *bufio.Reader, bw *bufio.Writer, f *requestFrame, code uint16, err error) bool {
	return s.refuseLeaseAfter(nc, lr, br, bw, f, code, err, 0)
}

// refuseLeaseAfter is refuseLease for a lease whose request waited on this
// owner (for a worker) before the refusal.
func (s *server) refuseLeaseAfter(nc net.Conn, lr *limitReader, br *bufio.Reader, bw *bufio.Writer, f *requestFrame, code uint16, err error, waited time.Duration) bool {
	if d, ok := s.acc.(leaseDropper); ok {
		d.drop(f.leaseBytes(), waited)
	}
	return s.reject(nc, lr, br, bw, f, code, err)
}

// budget takes the worker a sibling's exchange runs on, and reports how long
// it waited for one (0 when one was free at once): it waits no longer
// than maxLeaseWait or the caller's own wait for a connection (waitLeft, 0
// for no bound, from the frame's arrival but for the owner's few steps
// since), and ends near the frame's deadline (dl, zero for none) as
// the caller's own wait would, so that a lease the owner cannot start in
// time is rejected, retry-safe, rather than served late or aged out. The
// wait also ends when the server drains or closes: the request is refused,
// retry-safe, and its sender tries another plan.
func (s *server) budget(dl time.Time, waitLeft time.Duration) (*governor.LeaseSet, time.Duration, uint16, error) {
	if s.gov == nil {
		return nil, 0, 0, nil
	}
	if ls, ok := s.gov.TryAcquireMany(1, ownerStreamBytes); ok {
		return ls, 0, 0, nil
	}
	start := time.Now()
	bound, code := start.Add(s.maxLeaseWait), uint16(rejectOverload)
	if waitLeft > 0 && waitLeft < s.maxLeaseWait {
		bound = start.Add(waitLeft) // busy, within the caller's wait
	}
	if !dl.IsZero() && dl.Add(-s.near).Before(bound) {
		bound, code = dl.Add(-s.near), rejectDeadline
	}
	wctx, cancel := context.WithDeadline(s.leasing, bound)
	defer cancel()
	ls, err := s.gov.AcquireManyContext(wctx, 1, ownerStreamBytes)
	waited := time.Since(start)
	switch {
	case err == nil:
		return ls, waited, 0, nil
	case s.leasing.Err() != nil:
		return nil, waited, rejectClosing, errOwnerLeaving
	}
	return nil, waited, code, fmt.Errorf("%w: no worker free within %s", ErrOwnerBusy, waited.Round(time.Millisecond))
}

// peerHeadLimit bounds a sibling's request head, given the header limit of
// the Transport that made the connection: that limit is the responses', and
// may be set far below what a request head takes (a large cookie), which
// the sibling's own server accepted and the local path sends as it is.
// The bound is never less than net/http's server default, which is also
// Caddy's.
func peerHeadLimit(limit int64) int64 { return max(limit, http.DefaultMaxHeaderBytes) }

// ownerStreamBytes is what a sibling's exchange holds on the owner besides
// its buffers' growth: one exchange buffer and the peer stream's own bufio
// buffers.
const ownerStreamBytes = exchangeBuf + 2*readBufSize + 2*writeBufSize

// serveOne runs one exchange and reports whether the stream can carry
// another.
func (s *server) serveOne(nc net.Conn, cr *bgReader, lr *limitReader, br *bufio.Reader, bw *bufio.Writer, f *requestFrame) (inStep bool) {
	var deadline, dl time.Time
	if d, ok := f.deadlineTime(); ok {
		dl = d
		switch err := backpressure.Verdict(time.Now(), dl, s.near); {
		case errors.Is(err, backpressure.ErrDeadlineElapsed):
			return s.refuseLease(nc, lr, br, bw, f, rejectDeadline, errors.New("deadline passed before the owner saw the request"))
		case err != nil:
			return s.refuseLease(nc, lr, br, bw, f, rejectDeadline, fmt.Errorf("deadline within %s when the owner saw the request", s.near))
		}
		// The caller enforces its own deadline; the owner's is a backstop
		// a little later, so that the caller sees its deadline pass rather
		// than the owner's reaction to it. The watcher enforces it.
		deadline = dl.Add(ownerDeadlineGrace)
	}
	// Counted before the check, so that Shutdown, which marks the server
	// draining and then waits for the count, never misses one.
	inFlight := s.active.Add(1) - 1
	defer func() {
		// A stream whose exchange is over and left it in step carries
		// none before the count drops: Shutdown, which closes once the
		// count is 0, then finds it idle and refuses the frame the peer
		// may already have sent on it, rather than closing the stream
		// under that frame.
		if inStep {
			s.exchanging(nc, false)
		}
		s.active.Add(-1)
	}()
	if s.draining.Load() {
		return s.refuseLease(nc, lr, br, bw, f, rejectClosing, errOwnerLeaving)
	}
	if s.adm != nil && !s.adm.Admit(int(inFlight)) {
		return s.refuseLease(nc, lr, br, bw, f, rejectOverload, ErrNotAdmitted)
	}
	if err := awaitHead(nc, lr, br, deadline, f.flags&(flagBodyOnAccept|flagLength) == 0); err != nil {
		if d, ok := s.acc.(leaseDropper); ok {
			d.drop(f.leaseBytes(), 0)
		}
		if !isIOError(err) && !errors.Is(err, os.ErrDeadlineExceeded) {
			s.log.Info("request head from peer not read", zap.Error(err))
		}
		return false
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// The head may have come in well after the frame, up to the owner's
	// grace past the deadline: the deadline is judged again at the claim
	// of a worker, as every claim point judges it, or a request its
	// caller has given up on (and answered 504) would still go upstream.
	if !dl.IsZero() {
		if err := backpressure.Verdict(time.Now(), dl, s.near); err != nil {
			return s.refuseLease(nc, lr, br, bw, f, rejectDeadline, fmt.Errorf("%w once the request head was in", err))
		}
	}
	ls, waited, code, err := s.budget(dl, time.Duration(f.waitLeft))
	if err != nil {
		return s.refuseLeaseAfter(nc, lr, br, bw, f, code, err, waited)
	}
	defer ls.Release()
	hopMark(hopOwnerAdmit)
	exec, err := s.acc.accept(f.leaseBytes(), waited)
	if err != nil {
		// A refusal serves nothing: its worker goes back before the
		// refusal's write, which a peer that reads none of them blocks.
		ls.Release()
		return s.reject(nc, lr, br, bw, f, rejectCode(err), err)
	}
	hopMark(hopOwnerLease)
	// The head is bounded by the header limit of the Transport that made
	// the connection (see peerHeadLimit), and by the frame's deadline.
	limit := peerHeadLimit(exec.maxHeaderBytes())
	req, err := readPeerHead(nc, lr, br, deadline, limit)
	hopMark(hopOwnerHead)
	if err != nil {
		exec.abandon()
		switch {
		case errors.Is(err, errHeaderLimit):
			s.log.Info("request head from peer over the header limit", zap.Int64("limit", limit))
			refuseHead(nc, fmt.Errorf("%w: request head over the owner's limit of %d bytes", ErrRequestHeaderTooLarge, limit))
		case errors.Is(err, os.ErrDeadlineExceeded):
			s.log.Info("request head from peer not complete by its deadline")
		case isIOError(err):
			// The stream broke under the head: nobody to tell.
		default:
			s.log.Info("malformed request from peer", zap.Error(err))
			refuseHead(nc, fmt.Errorf("%w: %w", errMalformedRequestHead, err))
		}
		return false
	}
	ahead, err := readBodyWithHead(nc, br, f, req, deadline)
	if err != nil {
		exec.abandon()
		s.log.Info("short request body from peer not complete", zap.Error(err))
		return false
	}
	// A large request body asks for more buffers, on top of the worker it
	// holds: without waiting, so fewer when memory is short (see
	// governor.WithLease).
	bufs := 1
	if want := bufsFor(req.Body != http.NoBody, req.ContentLength); ls != nil && want > 1 {
		more, err := s.gov.AcquireManyContext(governor.WithLease(ctx, ls), want, exchangeBuf)
		if err == nil {
			defer more.Release()
			bufs = more.Workers()
		}
	}
	if bs, ok := exec.(bufSetter); ok {
		bs.setBufs(bufs)
	}
	ox := new(ownerExchange)
	w, rl := &ox.w, &ox.rl
	w.cr, w.nc, w.cancel, w.start, w.deadline = cr, nc, cancel, time.Now(), deadline
	rl.bw, rl.log, rl.bufs, rl.stopWatch = bw, s.log, bufs, func() { s.watcher.remove(w) }
	rl.waited = waited
	// What the peer wrote is exactly what it wants sent: Request.Write adds
	// a default User-Agent only when the header is absent, and an absent
	// header here means the peer chose to send none, unless the frame says
	// the request had none (see flagNoUserAgent).
	if f.flags&flagNoUserAgent != 0 {
		delete(req.Header, "User-Agent")
	} else if _, ok := req.Header["User-Agent"]; !ok {
		req.Header["User-Agent"] = []string{""}
	}
	req.RequestURI = ""
	var chunked *peerChunkedBody
	if req.Body != http.NoBody && slices.Equal(req.TransferEncoding, []string{"chunked"}) {
		chunked = &peerChunkedBody{cr: httputil.NewChunkedReader(br), br: br, lr: lr, limit: limit}
		req.Body = chunked
	}
	if f.flags&flagLength != 0 && req.Body != http.NoBody {
		// Chunked only to carry the trailers: the request the caller
		// made declared this length, and goes upstream with it.
		req.ContentLength = f.length
		req.TransferEncoding = nil
	}
	reqDone := &ox.body
	reqDone.ReadCloser, reqDone.onFirstRead = req.Body, ox.wantBody
	if ahead != nil {
		// Sent with the head, read, and written with it upstream. The
		// caller does not wait for the accept, which goes with the
		// first response; until then a failure is told in an error
		// frame, and the stream stays in step.
		req.Body = wholeBody(ahead)
		reqDone.done = true
	} else if req.Body != http.NoBody {
		req.Body = reqDone
	} else {
		reqDone.done = true
	}
	ox.trace.Got1xxResponse = rl.relay1xx
	ox.trace.GotFirstResponseByte = rl.firstByte
	ctx = httptrace.WithClientTrace(ctx, &ox.trace)
	_, h1 := exec.(*ownerExec)
	_, rl.h2 = exec.(*h2Exec)
	if !h1 {
		rl.shared, rl.pendingLimit = nc, exec.maxHeaderBytes()
	}
	if f.flags&flagNoInterim != 0 {
		rl.continueOnly = true
		if h1 {
			ctx = context.WithValue(ctx, interimShareLimit{}, true)
		} else {
			// The HTTP/2 client bounds the interim heads of a caller
			// without a hook itself, to the byte, so it gets none: the
			// caller's writer may wait for a 100, which the client
			// reports without its fields, and which has none for such a
			// caller.
			ox.trace.Got1xxResponse = nil
			ox.trace.Got100Continue = rl.relay100
		}
	}
	req = req.WithContext(ctx)
	if chunked != nil {
		chunked.req = req
	}

	w.peerQuiet()
	if !reqDone.done {
		reqDone.onEOF = w.peerQuiet
	}
	s.watcher.add(w)
	defer s.watcher.remove(w)

	// A failed exchange may leave its writer waiting for more of the body
	// from the peer; a read deadline in the past ends that wait, and the
	// stream, which is out of step then, is closed below. A body read whole
	// has no such wait, and the deadline would end the watch's read
	// instead, which then takes the peer for gone.
	stopBody := func() {
		if !reqDone.isDone() {
			cr.halt()
		}
	}
	if !s.exchanging(nc, true) {
		// Closing: close refused the request for us, and nothing of it
		// has gone anywhere.
		exec.abandon()
		return false
	}
	if h := testHookExchanging.Load(); h != nil {
		(*h)(ctx)
	}
	hopMark(hopOwnerSetup)
	resp, err := exec.roundTrip(req, stopBody)
	hopMark(hopUpstream)
	if err != nil {
		accepted := rl.failBeforeAccept()
		// 1xx heads queued before the failure go first, until the
		// watch's expiry at the latest.
		rl.settle()
		s.watcher.remove(w)
		if rl.err != nil {
			// A relayed 1xx did not go out whole: the peer is gone or
			// expired. The stream is out of step, and an error frame
			// would be read as part of a head.
			s.log.Info("a sibling's exchange failed relaying an interim response; closing the stream", zap.Error(rl.err))
			return false
		}
		var flags uint16
		if IsRetrySafe(err) {
			flags |= flagNothingSent
		}
		if pe := (*Error)(nil); errors.As(err, &pe) {
			if pe.idleClosed {
				flags |= flagIdleClosed
			}
			if pe.connGone {
				flags |= flagConnGone
			}
		}
		if rl.responseBegan.Load() {
			flags |= flagResponseBegan
		}
		// Before the accept, the error frame answers the request. After
		// it (and perhaps a 1xx, each written whole), it takes the place
		// of the next head, so the caller reports the upstream's failure
		// and not a dead owner.
		bw.Write(appendResponseFrame(nil, responseFrame{typ: frameError, flags: flags, code: errCode(err), msg: err.Error()}))
		// The watch has stopped, so the write deadline is this write's
		// (expire may have left one in the past): bounded as a
		// refusal's is.
		nc.SetWriteDeadline(time.Now().Add(peerHeadTimeout))
		flushed := bw.Flush() == nil
		nc.SetWriteDeadline(time.Time{})
		if accepted {
			// Some of the body may have come in, and more may be on its
			// way: the stream is out of step.
			s.log.Info("a sibling's exchange failed after its body began; closing the stream", zap.Error(err))
			return false
		}
		// Nothing was accepted, so the writer read none of the body
		// (its first read sends the accept), and a caller that holds
		// the body back until then sent none; a body sent with its
		// head was read whole: either way the stream is in step, and
		// its next exchange may read it (stopBody halted it).
		cr.resume()
		return flushed && (f.flags&flagBodyOnAccept != 0 || ahead != nil)
	}
	rl.reqDone = reqDone.isDone
	ok := rl.response(resp, req, nc, br)
	hopMark(hopRelay)
	if ok && !rl.keepStream {
		// A final response before the body, on a connection the upstream
		// keeps open (417 to an Expect, a 401): the writer sends the
		// body after it, as net/http's does, and the peer sends it on
		// the head. The stream ends, as the head told the peer, but not
		// before the writer has had the time net/http gives it
		// (maxWriteWait) to send the body, which keeps the upstream
		// connection.
		reqDone.settle(maxWriteWait)
	}
	s.watcher.remove(w)
	if rl.spliced {
		s.spliced.Add(1)
	}
	return ok && rl.keepStream && reqDone.isDone() && !cr.peerGone() && !w.hasExpired()
}

// ownerExchange holds what the parts of one sibling's exchange share, so
// that serving it costs one allocation rather than one for each.
type ownerExchange struct {
	w     watch
	rl    relay
	body  bodyDone
	trace httptrace.ClientTrace
}

// wantBody is the exchange's first read of the peer's body: the watch's
// read stops, and the peer is told to send.
func (ox *ownerExchange) wantBody() {
	ox.w.bodyWanted()
	ox.rl.acceptBody()
}

// ownerDeadlineGrace is how long after the caller's deadline the owner gives
// up on an exchange by itself.
const ownerDeadlineGrace = 100 * time.Millisecond
