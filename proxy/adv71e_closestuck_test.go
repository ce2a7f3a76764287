package proxy

import (
	"net"
	"testing"
	"time"
)

// TestAdv71eCloseWithUnreadIdleStreamsBounded: a sibling holds many idle
// streams to an owner (within its cap of idle streams per peer) and reads
// none of what the owner writes on them: each stream's send buffer is full,
// as after responses a stopped or broken peer never read. A plain
// Node.Close writes the closing refusal to every stream with no exchange,
// one after another and under the server's lock. Close must stay bounded,
// not grow with the number of such streams by a wait on each (THREATS
// "Bounded": a silent peer costs a timer, not the owner's shutdown): 120
// streams must not hold Close for over a second.
func TestAdv71eCloseWithUnreadIdleStreamsBounded(t *testing.T) {
	const streams = 120
	owner, _ := remotePair(t, nil)
	s := owner.node.srv
	addr := s.ln.Addr().String()
	var peers []net.Conn
	defer func() {
		for _, c := range peers {
			c.Close()
		}
	}()
	for range streams {
		c, err := net.Dial("unix", addr)
		if err != nil {
			t.Fatal(err)
		}
		peers = append(peers, c)
	}
	waitFor(t, 5*time.Second, "the owner to track every stream", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return len(s.conns) == streams
	})
	// Fill each stream's send buffer from the owner's side, as responses
	// the peer never read would have.
	junk := make([]byte, 4<<20)
	s.mu.Lock()
	full := 0
	for c, busy := range s.conns {
		if busy {
			continue
		}
		c.SetWriteDeadline(time.Now().Add(20 * time.Millisecond))
		if n, err := c.Write(junk); err != nil && n < len(junk) {
			full++
		}
		c.SetWriteDeadline(time.Time{})
	}
	s.mu.Unlock()
	if full != streams {
		t.Fatalf("filled %d of %d streams' buffers", full, streams)
	}
	start := time.Now()
	done := make(chan struct{})
	go func() { defer close(done); owner.node.Close() }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("Close hung")
	}
	if took := time.Since(start); took > time.Second {
		t.Fatalf("Close took %v with %d idle streams whose peer reads nothing; want it bounded, not a wait per stream", took, streams)
	}
}
