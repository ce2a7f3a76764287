package proxy

import (
	"bytes"
	"errors"
	"os"
	"syscall"
	"time"
	"unsafe"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"
)

// errUnsolicited is an idle connection on which the upstream sent bytes
// nobody asked for: a response too many, bytes after a body. Whatever it
// is, the next exchange must not read it as its own, so the connection is
// closed (net/http: "Unsolicited response received on idle HTTP channel").
var errUnsolicited = errors.New("unsolicited response received on idle connection")

// errIdleGone is an idle connection the upstream closed or broke.
var errIdleGone = errors.New("idle connection closed by upstream")

// tlsPeekWait bounds the read that decrypts what a TLS upstream sent while
// its connection sat idle. It runs only when the socket already has bytes,
// so it waits only for the rest of a record that has partly arrived.
const tlsPeekWait = 5 * time.Millisecond

// idleAlive reports whether an idle connection is still usable: nothing
// pending at any layer, and the upstream has not closed it. It costs no
// goroutine, so it runs before every reuse and in the idle sweep. An
// unsolicited response is logged to log, as net/http logs it.
func (c *conn) idleAlive(log *zap.Logger) bool {
	if c.closed.Load() {
		return false
	}
	sample, err := c.idleCheck()
	if err == nil {
		return true
	}
	if log != nil && errors.Is(err, errUnsolicited) && !is408(sample) {
		log.Warn("closing upstream connection", zap.Error(err),
			zap.Stringer("upstream", c.raw.RemoteAddr()), zap.ByteString("starting_with", sample))
	}
	return false
}

// idleCheck returns why an idle connection must not be reused, with the
// first bytes pending on it if there are any. Bytes can wait in three places:
// bufio's buffer; the socket, which a non-blocking MSG_PEEK sees (EOF too);
// and crypto/tls, which may hold plaintext (and records) it has already read
// from the socket but not returned: a TLS upstream that sent a second
// response in the record of the first. MSG_PEEK cannot see those, so a TLS
// connection is also read with a deadline in the past, which crypto/tls
// serves from what it holds and otherwise fails at once without a system
// call. When the socket does have bytes, the read gets tlsPeekWait to
// decrypt them: a close_notify is the upstream closing, application data is
// unsolicited, and anything else (a session ticket, or part of a record) is
// not worth the risk: the connection is closed quietly, as before.
//
// Bytes still in flight when the check runs are seen by nobody, here or in
// net/http: an upstream that sends them races its own next request.
func (c *conn) idleCheck() ([]byte, error) {
	if n := c.br.Buffered(); n > 0 {
		b, _ := c.br.Peek(min(n, 64))
		return b, errUnsolicited
	}
	sample, err := c.peekSocket()
	if err != nil {
		return nil, err
	}
	if c.tls == nil {
		if len(sample) > 0 {
			return sample, errUnsolicited
		}
		return nil, nil
	}
	dl := aLongTimeAgo
	if len(sample) > 0 {
		dl = time.Now().Add(tlsPeekWait)
	}
	if err := c.nc.SetReadDeadline(dl); err != nil {
		return nil, errIdleGone
	}
	_, err = c.br.Peek(1)
	if derr := c.nc.SetReadDeadline(time.Time{}); derr != nil {
		return nil, errIdleGone
	}
	switch {
	case err == nil:
		b, _ := c.br.Peek(min(c.br.Buffered(), 64))
		return b, errUnsolicited
	case !errors.Is(err, os.ErrDeadlineExceeded):
		// A close_notify or another alert, or a broken connection.
		return nil, errIdleGone
	}
	if len(sample) > 0 {
		// The socket had bytes, and decrypting them gave nothing to read
		// in time: a post-handshake message, or part of a record. The
		// two cannot be told apart from here, and the second would be
		// read by the next exchange.
		return nil, errIdleGone
	}
	return nil, nil
}

// peeker looks at what waits on a socket without taking it. It is built at
// a connection's first check and kept, so that the check before each reuse
// allocates nothing.
type peeker struct {
	rc  syscall.RawConn
	fn  func(fd uintptr) bool
	buf [64]byte
	n   int
	err error
}

// peekSocket returns up to 64 bytes waiting on the socket without taking
// them (in c.peek.buf, valid until the next peek), or errIdleGone if the
// upstream closed it.
func (c *conn) peekSocket() ([]byte, error) {
	p := &c.peek
	if p.rc == nil {
		sc, ok := c.raw.(syscall.Conn)
		if !ok {
			return nil, nil
		}
		rc, err := sc.SyscallConn()
		if err != nil {
			return nil, errIdleGone
		}
		p.rc, p.fn = rc, p.recv
	}
	if err := p.rc.Read(p.fn); err != nil {
		return nil, errIdleGone
	}
	if p.err != nil || p.n == 0 {
		return nil, p.err
	}
	return p.buf[:p.n], nil
}

// recv is one non-blocking MSG_PEEK. It never asks to wait: an idle socket
// with nothing on it is the common, healthy case.
func (p *peeker) recv(fd uintptr) bool {
	for {
		n, _, errno := unix.Syscall6(unix.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&p.buf[0])), uintptr(len(p.buf)),
			unix.MSG_PEEK|unix.MSG_DONTWAIT, 0, 0)
		switch {
		case errno == unix.EINTR:
			continue
		case errno == 0 && n > 0:
			p.n, p.err = int(n), nil
		case errno == unix.EAGAIN:
			p.n, p.err = 0, nil
		default: // 0 bytes: the upstream closed; or the socket failed
			p.n, p.err = 0, errIdleGone
		}
		return true
	}
}

// is408 reports whether b starts a 408 response, which an upstream sends
// when it times an idle connection out: a close, not worth a warning.
func is408(b []byte) bool {
	_, rest, ok := bytes.Cut(b, []byte(" "))
	return ok && bytes.HasPrefix(b, []byte("HTTP/1.")) && bytes.HasPrefix(rest, []byte("408"))
}
