package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestAdv74bHerdServedInTurn: b's table (one slot) is busy, and six of its
// requests to U pause (a minute each) with one fleet watch on U. a has the
// only connection of U, busy. When it goes idle, b's requests must be served
// one after another through it: each unit that comes back (a's connection
// idle again after each of b's uses) wakes the next. Every request must end
// served within its deadline, well before its pause would end; and, once
// served, no paused request and no fleet watch is left in b.
func TestAdv74bHerdServedInTurn(t *testing.T) {
	a, b := fullTablePair(t, 4)

	step := make(chan struct{})
	var stepOnce sync.Once
	endStep := func() { stepOnce.Do(func() { close(step) }) }
	defer endStep()
	var served atomic.Int32
	u := rawUpstream(t, func(c net.Conn, _ *bufio.Reader, req *http.Request) bool {
		if req.URL.Path != "/stream" {
			time.Sleep(20 * time.Millisecond)
			served.Add(1)
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
			return true
		}
		io.WriteString(c, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n")
		<-step
		io.WriteString(c, "0\r\n\r\n")
		return true
	})
	held := holdStreams(t, a, u, 1)[0] // a's connection of U, busy

	const N = 6
	errs := make(chan error, N)
	for i := range N {
		go func() {
			start := time.Now()
			_, body, err := roundTripWithin(b.tr, u+"/", 5*time.Second)
			if err == nil && body != "ok" {
				err = fmt.Errorf("body %q", body)
			}
			if err != nil {
				err = fmt.Errorf("request %d after %v: %w", i, time.Since(start).Round(time.Millisecond), err)
			}
			errs <- err
		}()
	}
	waitFor(t, 5*time.Second, "b's requests to pause for room", func() bool { return b.node.room.n.Load() == N })
	start := time.Now()
	endStep()
	drain(held)
	var failed []error
	for range N {
		if err := <-errs; err != nil {
			failed = append(failed, err)
		}
	}
	if len(failed) > 0 {
		t.Fatalf("%d of %d paused requests not served (%d served by U) %v after a's connection went idle: %v",
			len(failed), N, served.Load(), time.Since(start).Round(time.Millisecond), failed)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("the %d paused requests were served only %v after a's connection went idle", N, d)
	}
	waitFor(t, 2*time.Second, "no paused request and no fleet watch left in b", func() bool {
		b.node.fleetRoom.mu.Lock()
		k := len(b.node.fleetRoom.keys)
		b.node.fleetRoom.mu.Unlock()
		return b.node.room.n.Load() == 0 && k == 0
	})
}
