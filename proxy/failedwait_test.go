package proxy

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"testing"
	"time"
)

// TestFailedCloseWaitHoldsTheUnitUntilTheUpstreamCloses: cap 1; a client
// gives up on a response mid-body, and the upstream, still busy with the
// request, closes its side 600ms after it read our half-close. With a
// FailedCloseWait above that, the connection keeps its unit of the budget
// until the upstream's close, not just closeWait (250ms): a replacement
// dialed before the close would be refused by an upstream that caps its
// connections. The wait ends with the upstream's close, and the upstream is
// not taken as slow to close.
func TestFailedCloseWaitHoldsTheUnitUntilTheUpstreamCloses(t *testing.T) {
	const busy = 600 * time.Millisecond
	halfClosed := make(chan time.Time, 4)
	url := rawUpstream(t, func(c net.Conn, br *bufio.Reader, req *http.Request) bool {
		io.WriteString(c, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		io.Copy(io.Discard, br) // until our half-close
		halfClosed <- time.Now()
		time.Sleep(busy)
		c.Close()
		return false
	})
	spec := testSpec
	spec.Path = filepath.Join(t.TempDir(), "seg")
	m := newMemberOpts(t, spec, NodeOptions{SweepInterval: 50 * time.Millisecond, FailedCloseWait: 3 * time.Second}, func(tr *Transport) { tr.MaxConnsPerKey = 1 })
	key := retireKey(t, m.tr, url+"/")
	abandonMidBody(t, m.tr, url+"/slow")
	var at time.Time
	select {
	case at = <-halfClosed:
	case <-time.After(3 * time.Second):
		t.Fatal("the upstream never saw the half-close: the failed connection did not linger")
	}
	// Well past closeWait, well before the upstream's close.
	time.Sleep(time.Until(at.Add(busy / 2)))
	if n := m.pool.Live(key); n != 1 {
		t.Fatalf("%v after the half-close, with the upstream still busy, the key holds %d units; want the failed connection's 1", time.Since(at).Round(time.Millisecond), n)
	}
	deadline := at.Add(busy + 2*time.Second)
	for m.pool.Live(key) != 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if n := m.pool.Live(key); n != 0 {
		t.Fatalf("%v after the half-close, past the upstream's close, the key still holds %d units", time.Since(at).Round(time.Millisecond), n)
	}
	if kc := m.node.capOf(key); kc == nil || !kc.lingering() {
		t.Errorf("an upstream that closed within FailedCloseWait was taken as slow to close")
	}
}

// abandonMidBody is a client that goes away mid-response: it reads the first
// 5 bytes of the body of GET url on tr, and closes it.
func abandonMidBody(t *testing.T, tr *Transport, url string) {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(resp.Body, make([]byte, 5)); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
}
