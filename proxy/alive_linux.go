package proxy

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// idleAlive reports whether an idle connection is still usable: nothing
// buffered, and a non-blocking MSG_PEEK on the socket finds neither EOF nor
// unexpected bytes (a 408, a TLS close_notify). It costs one syscall and no
// goroutine, so it runs before every reuse and in the idle sweep.
func (c *conn) idleAlive() bool {
	if c.closed.Load() || c.br.Buffered() > 0 {
		return false
	}
	sc, ok := c.raw.(syscall.Conn)
	if !ok {
		return true
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	alive := false
	err = rc.Read(func(fd uintptr) bool {
		var b [1]byte
		n, _, err := unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		alive = n < 0 && (err == unix.EAGAIN || err == unix.EWOULDBLOCK)
		return true
	})
	return err == nil && alive
}
