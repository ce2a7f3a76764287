package proxy

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/orbitpool"
)

// TestAdv74bNodeCloseEndsFleetWatches: b's table is full and requests to
// three upstreams pause (a minute each) with a fleet watch per key. Closing
// b's Node (its pool still open) must end every paused request at once, and
// with them every fleet watch and its relay goroutine; closing the pool
// after leaves no goroutine of the proxy's fleet watch.
func TestAdv74bNodeCloseEndsFleetWatches(t *testing.T) {
	spec := orbitpool.PoolSpec{Lanes: 2, Keys: 8, ResourcesPerLane: 1, Path: filepath.Join(t.TempDir(), "seg")}
	conf := func(tr *Transport) {
		tr.MaxConnsPerKey = 8
		tr.fullPauseBase = time.Minute
	}
	a, b := newMember(t, spec, conf), newMember(t, spec, conf)
	_ = a
	release := make(chan struct{})
	defer close(release)
	holdStreams(t, b, closingStreamUpstream(t, release, false), 1) // b's one slot, busy
	var urls []string
	for range 3 {
		urls = append(urls, rawUpstream(t, func(c net.Conn, _ *bufio.Reader, req *http.Request) bool {
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
			return true
		}))
	}
	const per = 3
	ends := make(chan time.Time, per*len(urls))
	for _, u := range urls {
		for range per {
			go func() {
				roundTripWithin(b.tr, u+"/", 8*time.Second)
				ends <- time.Now()
			}()
		}
	}
	waitFor(t, 5*time.Second, "b's requests to pause", func() bool { return b.node.room.n.Load() == per*int32(len(urls)) })
	b.node.fleetRoom.mu.Lock()
	watched := len(b.node.fleetRoom.keys)
	b.node.fleetRoom.mu.Unlock()
	if watched != len(urls) {
		t.Fatalf("%d keys watched, want %d", watched, len(urls))
	}
	closed := time.Now()
	b.node.Close()
	for range per * len(urls) {
		select {
		case e := <-ends:
			if d := e.Sub(closed); d > time.Second {
				t.Errorf("a paused request ended %v after its Node closed", d)
			}
		case <-time.After(3 * time.Second):
			t.Fatalf("paused requests still running 3s after their Node closed")
		}
	}
	relays := func() int {
		n := 0
		for _, g := range adv74aOrbitGoroutines() {
			if strings.Contains(g, "fleetRoom") {
				n++
			}
		}
		return n
	}
	waitFor(t, 2*time.Second, "the fleet watches' relays to end after Node.Close", func() bool { return relays() == 0 })
	b.node.fleetRoom.mu.Lock()
	watched = len(b.node.fleetRoom.keys)
	b.node.fleetRoom.mu.Unlock()
	if watched != 0 {
		t.Fatalf("%d keys still watched after every paused request ended", watched)
	}
}
