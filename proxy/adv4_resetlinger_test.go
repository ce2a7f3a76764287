package proxy

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"testing"
	"time"
)

// TestAdv4ResetIsNotSlowToClose: cap 1; a client gives up on a response
// mid-body, and the upstream resets the connection as soon as it reads our
// half-close. It let the connection go at once, so the key must not be
// marked as slow to close (lingeredInVain): that turns lingering off for
// lingerPause, so that the next failed connections give their unit back
// before a capped upstream has read their close, and logs that the
// upstream is slow.
func TestAdv4ResetIsNotSlowToClose(t *testing.T) {
	eof := make(chan struct{}, 4)
	url := rawUpstream(t, func(c net.Conn, br *bufio.Reader, req *http.Request) bool {
		io.WriteString(c, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		io.Copy(io.Discard, br) // until our half-close
		eof <- struct{}{}
		c.(*net.TCPConn).SetLinger(0)
		c.Close() // reset
		return false
	})
	m := newFleet(t, 1, func(tr *Transport) { tr.MaxConnsPerKey = 1 })[0]
	key := retireKey(t, m.tr, url+"/")
	abandonMidBody(t, m.tr, url+"/slow")
	select {
	case <-eof:
	case <-time.After(3 * time.Second):
		t.Fatal("the upstream never saw the half-close: the failed connection did not linger")
	}
	deadline := time.Now().Add(closeWait + time.Second)
	for m.pool.Live(key) != 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(20 * time.Millisecond)
	kc := m.node.capOf(key)
	if kc == nil {
		t.Fatal("no cap state for the key")
	}
	if !kc.lingering() {
		t.Errorf("an upstream that reset the failed connection at once was taken as slow to close: lingering is off for %v more",
			time.Duration(kc.noLingerUntil.Load()-sinceStart(time.Now())))
	}
}
