package proxy

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"os"
	"sync"
	"time"

	"go.uber.org/zap"
)

// acceptor turns a remote lease into the right to use one of this process's
// upstream connections. The Transport implements it over the pool; tests use
// fakes.
type acceptor interface {
	accept(lease []byte) (execution, error)
}

// execution is one accepted lease: a request may be sent on the leased
// connection exactly once, or the execution abandoned. Either way it
// completes itself, which is what gives the capacity back.
type execution interface {
	// roundTrip runs req; stopBody makes a pending read of its body return.
	roundTrip(req *http.Request, stopBody func()) (*http.Response, error)
	abandon()
}

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
	ln    *net.UnixListener
	acc   acceptor
	log   *zap.Logger
	admit func(ctx context.Context) (release func(), err error)

	watcher watcher

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

func newServer(ln *net.UnixListener, acc acceptor, log *zap.Logger) *server {
	if log == nil {
		log = zap.NewNop()
	}
	return &server{ln: ln, acc: acc, log: log, conns: make(map[net.Conn]struct{})}
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
		if err := checkPeer(c); err != nil {
			s.log.Warn("peer refused", zap.Error(err))
			c.Close()
			continue
		}
		if !s.track(c, true) {
			c.Close()
			return ErrClosed
		}
		s.wg.Add(1)
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
			s.serveConn(c)
		}()
	}
}

func (s *server) track(c net.Conn, add bool) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if add {
		if s.closed {
			return false
		}
		s.conns[c] = struct{}{}
	} else {
		delete(s.conns, c)
	}
	return true
}

// close stops accepting, closes every peer stream and waits for their
// goroutines; in-flight exchanges end with an error on both sides.
func (s *server) close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	err := s.ln.Close()
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	return err
}

// serveConn runs one peer's persistent stream: frame, request, response, and
// again, until the peer goes, a message cannot be framed, or an exchange
// leaves the stream out of step.
func (s *server) serveConn(nc *net.UnixConn) {
	cr := &bgReader{nc: nc}
	cr.cond.L = &cr.mu
	br := bufio.NewReaderSize(cr, readBufSize)
	bw := bufio.NewWriterSize(nc, writeBufSize)
	for {
		nc.SetReadDeadline(time.Now().Add(2 * peerIdleTimeout))
		f, err := readFrame(br, reqHeaderLen, decodeRequestFrame)
		nc.SetReadDeadline(time.Time{})
		if err != nil {
			switch {
			case errors.Is(err, io.EOF), errors.Is(err, net.ErrClosed), errors.Is(err, os.ErrDeadlineExceeded):
				// The peer left, we are closing, or the stream sat idle.
			default:
				s.log.Info("peer stream closed", zap.Error(err))
			}
			return
		}
		if !s.serveOne(nc, cr, br, bw, &f) {
			return
		}
	}
}

// reject answers a frame with a refusal. The stream ends after it: the
// request that follows was never meant for anyone else, and skipping it
// safely would mean reading a body nobody wants.
func (s *server) reject(bw *bufio.Writer, code uint16, err error) {
	bw.Write(appendResponseFrame(nil, responseFrame{typ: frameReject, code: code, msg: err.Error()}))
	bw.Flush()
}

func rejectCode(err error) uint16 {
	var re *rejectError
	if errors.As(err, &re) {
		return re.code
	}
	return rejectUnknown
}

// serveOne runs one exchange and reports whether the stream can carry
// another.
func (s *server) serveOne(nc net.Conn, cr *bgReader, br *bufio.Reader, bw *bufio.Writer, f *requestFrame) bool {
	var deadline time.Time
	if dl, ok := f.deadlineTime(); ok {
		if !time.Now().Before(dl) {
			s.reject(bw, rejectDeadline, errors.New("deadline passed before the owner saw the request"))
			return false
		}
		// The caller enforces its own deadline; the owner's is a backstop
		// a little later, so that the caller sees its deadline pass rather
		// than the owner's reaction to it. The watcher enforces it.
		deadline = dl.Add(ownerDeadlineGrace)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	if s.admit != nil {
		release, err := s.admit(ctx)
		if err != nil {
			s.reject(bw, rejectOverload, err)
			return false
		}
		defer release()
	}
	exec, err := s.acc.accept(f.leaseBytes())
	if err != nil {
		s.reject(bw, rejectCode(err), err)
		return false
	}
	req, err := http.ReadRequest(br)
	if err != nil {
		exec.abandon()
		s.log.Info("malformed request from peer", zap.Error(err))
		return false
	}
	w := &watch{cr: cr, cancel: cancel, start: time.Now(), deadline: deadline}
	rl := &relay{bw: bw, log: s.log, stopWatch: func() { s.watcher.remove(w) }}
	// What the peer wrote is exactly what it wants sent: Request.Write adds
	// a default User-Agent only when the header is absent, and an absent
	// header here means the peer chose to send none.
	if _, ok := req.Header["User-Agent"]; !ok {
		req.Header["User-Agent"] = []string{""}
	}
	req.RequestURI = ""
	reqDone := &bodyDone{ReadCloser: req.Body}
	if req.Body != http.NoBody {
		req.Body = reqDone
	} else {
		reqDone.done = true
	}
	trace := &httptrace.ClientTrace{Got1xxResponse: rl.relay1xx}
	ctx = httptrace.WithClientTrace(ctx, trace)
	req = req.WithContext(ctx)

	if reqDone.done {
		w.bodyDone()
	} else {
		reqDone.onEOF = w.bodyDone
	}
	s.watcher.add(w)
	defer s.watcher.remove(w)

	// A failed exchange may leave its writer waiting for more of the body
	// from the peer; a read deadline in the past ends that wait, and the
	// stream, which is out of step then, is closed below.
	stopBody := func() { nc.SetReadDeadline(aLongTimeAgo) }
	resp, err := exec.roundTrip(req, stopBody)
	if err != nil {
		s.watcher.remove(w)
		if rl.sentAccept {
			// A 1xx went out; the stream cannot carry an error frame now.
			return false
		}
		var flags uint16
		if IsRetrySafe(err) {
			flags |= flagNothingSent
		}
		var pe *Error
		if errors.As(err, &pe) && pe.idleClosed {
			flags |= flagIdleClosed
		}
		bw.Write(appendResponseFrame(nil, responseFrame{typ: frameError, flags: flags, code: errCode(err), msg: err.Error()}))
		bw.Flush()
		return false
	}
	rl.reqDone = reqDone.isDone
	ok := rl.response(resp, req, nc, br)
	done := reqDone.isDone()
	s.watcher.remove(w)
	return ok && done && !cr.peerGone()
}

// ownerDeadlineGrace is how long after the caller's deadline the owner gives
// up on an exchange by itself.
const ownerDeadlineGrace = 100 * time.Millisecond
