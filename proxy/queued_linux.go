package proxy

import (
	"errors"
	"io"
	"net"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// peekQueued waits, bounded by nc's read deadline, until nc's socket holds
// bytes that nothing has read, and copies as many as buf holds of them
// into it without reading them: the caller then reads exactly those it
// wants. A peer gone with nothing queued is io.ErrUnexpectedEOF. ok is
// false for a conn that is not a socket.
func peekQueued(nc net.Conn, buf []byte) (n int, ok bool, err error) {
	rc := socketOf(nc)
	if rc == nil || len(buf) == 0 {
		return 0, false, nil
	}
	var perr error
	err = rc.Read(func(fd uintptr) bool {
		for {
			k, _, errno := unix.Syscall6(unix.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)),
				unix.MSG_PEEK|unix.MSG_DONTWAIT, 0, 0)
			switch {
			case errno == unix.EINTR:
				continue
			case errno == unix.EAGAIN:
				return false // wait for some
			case errno != 0:
				perr = errno
			case k == 0:
				perr = io.ErrUnexpectedEOF
			default:
				n = int(k)
			}
			return true
		}
	})
	if err != nil {
		return 0, true, err
	}
	return n, true, perr
}

// errWouldBlock is a write the socket had no room for.
var errWouldBlock = errors.New("proxy: socket full")

// writeNoWait writes b to nc's socket without waiting, at most flushChunk
// bytes a write (see unsent): it returns how much went, and errWouldBlock if
// the socket had no room for the rest.
func writeNoWait(nc net.Conn, b []byte) (n int, err error) {
	rc := socketOf(nc)
	if rc == nil {
		return nc.Write(b)
	}
	var werr error
	err = rc.Write(func(fd uintptr) bool {
		for n < len(b) {
			k, err := unix.Write(int(fd), b[n:min(len(b), n+flushChunk)])
			switch {
			case err == unix.EINTR:
				continue
			case err == unix.EAGAIN:
				werr = errWouldBlock
				return true
			case err != nil:
				werr = err
				return true
			}
			n += k
		}
		return true
	})
	if err != nil {
		return n, err
	}
	return n, werr
}

// unsent reports how many bytes written to nc's socket its peer has not
// read yet; ok is false for a conn that is not a socket. On a unix stream
// socket it is the memory of the writes not yet read whole (with their
// overhead): it falls only as the peer finishes reading a write.
func unsent(nc net.Conn) (n int, ok bool) {
	rc := socketOf(nc)
	if rc == nil {
		return 0, false
	}
	var ierr error
	if err := rc.Control(func(fd uintptr) { n, ierr = unix.IoctlGetInt(int(fd), unix.SIOCOUTQ) }); err != nil || ierr != nil {
		return 0, false
	}
	return n, true
}

// socketOf is nc's socket, or nil for a conn that is not one.
func socketOf(nc net.Conn) syscall.RawConn {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	return rc
}
