package proxy

import (
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
	sc, isSock := nc.(syscall.Conn)
	if !isSock || len(buf) == 0 {
		return 0, false, nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
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

// writeNoWait writes b to nc's socket in one non-blocking write: what the
// socket has no room for is errPeerNotReading, and then some of b may have
// gone.
func writeNoWait(nc net.Conn, b []byte) error {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		_, err := nc.Write(b)
		return err
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return err
	}
	var werr error
	err = rc.Write(func(fd uintptr) bool {
		for len(b) > 0 {
			n, err := unix.Write(int(fd), b)
			switch {
			case err == unix.EINTR:
				continue
			case err == unix.EAGAIN:
				werr = errPeerNotReading
			case err != nil:
				werr = err
			}
			if err != nil {
				return true
			}
			b = b[n:]
		}
		return true
	})
	if err != nil {
		return err
	}
	return werr
}
