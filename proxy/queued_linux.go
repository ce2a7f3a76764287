package proxy

import (
	"io"
	"net"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// awaitQueued waits, bounded by nc's read deadline, until nc's socket holds
// n bytes that nothing has read, and leaves them there. It is how awaitHead
// waits for the end of a short body that the read buffer, full of the head
// and the body's start, has no room for. A conn that is not a socket is not
// waited for.
func awaitQueued(nc net.Conn, n int) error {
	sc, ok := nc.(syscall.Conn)
	if !ok || n <= 0 {
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return err
	}
	buf := make([]byte, n)
	var perr error
	err = rc.Read(func(fd uintptr) bool {
		for {
			k, _, errno := unix.Syscall6(unix.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)),
				unix.MSG_PEEK|unix.MSG_DONTWAIT, 0, 0)
			switch {
			case errno == unix.EINTR:
				continue
			case errno == unix.EAGAIN:
				return false // wait for more
			case errno != 0:
				perr = errno
				return true
			case k == 0:
				perr = io.ErrUnexpectedEOF
				return true
			}
			// Fewer than n: the poller wakes this again when more come.
			return int(k) >= n
		}
	})
	if err != nil {
		return err
	}
	return perr
}
