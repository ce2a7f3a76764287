package proxy

import (
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// waitH2WriteBlocked waits until a write on hc is blocked in its socket (its
// upstream reads nothing), as the callers' hazards need. With x/net's own
// client a read of hc's state then waits for that write too, which is the
// hazard. Go 1.27's client under x/net's wrapper (h2Wrapped) reads its
// state without the write lock, so there the wait is for the socket's send
// queue to hold bytes and stop draining; the caller's property must then
// hold all the more.
func waitH2WriteBlocked(t *testing.T, hc *h2conn) {
	t.Helper()
	if !h2Wrapped {
		waitFor(t, 10*time.Second, "a read of the connection's state to wait for its blocked write", func() bool {
			done := make(chan struct{})
			go func() { hc.cc.State(); close(done) }()
			select {
			case <-done:
				return false
			case <-time.After(200 * time.Millisecond):
				return true
			}
		})
		return
	}
	sc, ok := hc.c.raw.(syscall.Conn)
	if !ok {
		t.Fatalf("the connection's socket is a %T", hc.c.raw)
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	queued := func() int {
		n := -1
		rc.Control(func(fd uintptr) { n, _ = unix.IoctlGetInt(int(fd), unix.SIOCOUTQ) })
		return n
	}
	waitFor(t, 10*time.Second, "the connection's write to block: its send queue full and not draining", func() bool {
		before := queued()
		time.Sleep(200 * time.Millisecond)
		return before > 0 && queued() == before
	})
}
