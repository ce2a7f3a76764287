package proxy

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/orbitpool"
)

// TestAdv74bPausedWatchHoldsItsKeyEntry: b's table (one slot) is busy, so
// its request to U pauses (a minute) with a fleet watch on U. No process has
// a connection of U yet, so U's key entry is idle; with two key entries, a's
// request to another upstream V finds none for V: U's is not collected while
// b's request watches it (given to V, the watch would never be woken by U's
// room again), and a's request fails by its deadline, retry-safe, with the
// table's error. a's request to U then leaves a's connection of U idle: room
// on a sibling's connection of U. b's paused request must be woken and
// served through it at once, not at the end of its pause (its deadline).
func TestAdv74bPausedWatchHoldsItsKeyEntry(t *testing.T) { pausedWatch(t, true) }

// TestAdv74bPausedWatchNoRecycle is the control: the same without V; it
// shows the wake itself works.
func TestAdv74bPausedWatchNoRecycle(t *testing.T) { pausedWatch(t, false) }

func pausedWatch(t *testing.T, recycle bool) {
	a, b := fullTablePair(t, 2)

	u := rawUpstream(t, func(c net.Conn, _ *bufio.Reader, req *http.Request) bool {
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		return true
	})
	v := rawUpstream(t, func(c net.Conn, _ *bufio.Reader, req *http.Request) bool {
		io.WriteString(c, "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok")
		return false
	})

	type result struct {
		err  error
		body string
		took time.Duration
	}
	done := make(chan result, 1)
	go func() {
		start := time.Now()
		_, body, err := roundTripWithin(b.tr, u+"/", 6*time.Second)
		done <- result{err, body, time.Since(start)}
	}()
	waitFor(t, 5*time.Second, "b's request to pause for room", func() bool { return b.node.room.n.Load() == 1 })

	if recycle {
		// a's request to V: U's idle entry is watched, so not V's.
		start := time.Now()
		_, _, err := roundTripWithin(a.tr, v+"/", time.Second)
		var pe *Error
		if !errors.Is(err, orbitpool.ErrFull) || !errors.As(err, &pe) || !pe.RetrySafe {
			t.Fatalf("a's request to V with every key entry held: %v; want the table's error, retry-safe", err)
		}
		if d := time.Since(start); d > 1500*time.Millisecond {
			t.Fatalf("a's request to V ended %v after it began; its deadline was 1s", d)
		}
	}
	// a's request to U: a's connection of U stays, idle.
	if _, body, err := roundTripWithin(a.tr, u+"/", 3*time.Second); err != nil || body != "ok" {
		t.Fatalf("a's request to U: %q %v", body, err)
	}
	idleAt := time.Now()
	r := <-done
	if r.err != nil || r.body != "ok" {
		t.Fatalf("b's paused request to U: body %q err %v after %v (%v after a's connection of U went idle); "+
			"want it woken and served through a's connection", r.body, r.err, r.took, time.Since(idleAt))
	}
	if d := time.Since(idleAt); d > 2*time.Second {
		t.Fatalf("b's paused request served %v after a's connection of U went idle; want at once", d)
	}
}
