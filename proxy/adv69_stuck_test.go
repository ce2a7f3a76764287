package proxy

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/orbitpool"
)

// adv69ClosingStream is an upstream whose /stream holds its body open until
// release is closed, then ends it and closes the connection
// (Connection: close).
func adv69ClosingStream(t *testing.T, release chan struct{}) string {
	return rawUpstream(t, func(c net.Conn, _ *bufio.Reader, req *http.Request) bool {
		io.WriteString(c, "HTTP/1.1 200 OK\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n")
		<-release
		io.WriteString(c, "0\r\n\r\n")
		c.Close()
		return false
	})
}

// TestAdv69RoomBackAfterFullWait: one process, a capped upstream K (1 of
// its 8 connections held busy) and another upstream holding the table's
// other slot. A request R to K finds the table full and waits. Then the
// other upstream's connection ends and closes: the table has room again.
// A later request R2 to K, which now could dial (room in the table, K far
// below its cap), must be served promptly rather than parked behind R's
// wait for one of K's connections. (R, woken as the room came, may be
// served first: its connection is then R2's to reuse, which /conn allows.)
func TestAdv69RoomBackAfterFullWait(t *testing.T) {
	spec := orbitpool.PoolSpec{Lanes: 1, Keys: 4, ResourcesPerLane: 2}
	rel1, closed1 := make(chan struct{}), make(chan bool, 16)
	defer close(rel1)
	rel2 := make(chan struct{})
	k := unpooledUpstream(t, rel1, closed1)
	other := adv69ClosingStream(t, rel2)
	m := newMember(t, spec, func(tr *Transport) { tr.MaxConnsPerKey = 8 })
	holdStreams(t, m, k, 1)
	held := holdStreams(t, m, other, 1)

	rerr := make(chan error, 1)
	go func() {
		_, err := adv69Get(m.tr, k+"/conn", 2*time.Second)
		rerr <- err
	}()
	time.Sleep(200 * time.Millisecond) // R is parked on K
	close(rel2)
	drain(held[0])
	waitFor(t, 3*time.Second, "the other upstream's connection closed", func() bool { return m.node.Stats().Retired == 1 })

	start := time.Now()
	body, err := adv69Get(m.tr, k+"/conn", 3*time.Second)
	took := time.Since(start)
	re := <-rerr
	if err != nil || body == "" || took > time.Second {
		t.Fatalf("R2 to K with room in the table and K at 1 of 8: %q, %v after %v; want it served at once (R: %v)", body, err, took, re)
	}
}
