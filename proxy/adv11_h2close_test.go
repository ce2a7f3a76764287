package proxy

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"
)

// TestAdv11H2CloseDuringRetirement: Node.Close made while HTTP/2
// connections retire in good order, waiting for an upstream that closes
// its side only after 2s, returns once the retirements have given up
// (closeWait), not when the upstream closes; the connections leave the
// pool, and their goroutines and descriptors are gone.
func TestAdv11H2CloseDuringRetirement(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sl := &slowCloseListener{Listener: ln, delay: 2 * time.Second}
	ts := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ok")
	}))
	ts.Listener.Close()
	ts.Listener = sl
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	ts.Config.Protocols = &p
	ts.Start()
	t.Cleanup(ts.Close)
	url := ts.URL + "/"

	m := newMember(t, testSpec, h2cConf)
	done := make(chan error, 3)
	for range 3 {
		go func() { done <- getOK(m, t.Context(), url) }()
	}
	for range 3 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	key := mustKey(t, m.tr, url)
	if c, _ := m.pool.Candidates(key, nil); len(c) == 0 {
		t.Fatal("no connection registered")
	}
	m.tr.CloseIdleConnections()
	start := time.Now()
	m.node.Close()
	if d := time.Since(start); d > 4*closeWait {
		t.Errorf("Node.Close took %s with retirements under way; want at most %s", d, 4*closeWait)
	}
	if c, _ := m.pool.Candidates(key, nil); len(c) != 0 {
		t.Errorf("after Node.Close: %+v still in the pool", c)
	}
	// A retirement has given its count back as it returns: its goroutine
	// may still be on its way out.
	buf := make([]byte, 1<<20)
	retiring := func() int { return strings.Count(string(buf[:runtime.Stack(buf, true)]), "retireH2InOrder") }
	for deadline := time.Now().Add(time.Second); retiring() != 0 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	if n := retiring(); n != 0 {
		t.Errorf("1s after Node.Close: %d retirements still running", n)
	}
	if n := adv11DeadSockets(t); n != 0 {
		t.Errorf("after Node.Close: %d descriptors of closed sockets", n)
	}
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	deadline := time.Now().Add(time.Second)
	for adv11Sockets(t, port) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("after Node.Close: %d sockets to the upstream still open here", adv11Sockets(t, port))
		}
		time.Sleep(10 * time.Millisecond)
	}
}
