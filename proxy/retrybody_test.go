package proxy

import (
	"io"
	"testing"
)

// TestRetriedBodyKeepsItsEarlierAttemptsCloses: a streamed body that one
// attempt gave up unread goes, whole, to the next; what the first attempt
// asked of it must not reach the second. Its close, left pending while the
// body was unread, would happen as the second attempt's response arrived
// (settle), and a stop sent on a goroutine of its own (an owner's HTTP/2
// stream failed, see peers.roundTrip) would land once the second attempt
// had read the body: either cut a bidirectional stream's request short
// after its first message ("body closed by handler" through Caddy, seen in
// CI as a call after a GOAWAY that lost its trailers).
func TestRetriedBodyKeepsItsEarlierAttemptsCloses(t *testing.T) {
	pr, pw := io.Pipe()
	defer pw.Close()
	tb := &trackBody{rc: pr}
	first := tb.attemptNo()
	tb.Close() // the first attempt ends without reading it: pending
	tb.again() // the retry takes it

	send := func(s string) {
		t.Helper()
		go pw.Write([]byte(s))
		p := make([]byte, len(s))
		if _, err := io.ReadFull(tb, p); err != nil || string(p) != s {
			t.Fatalf("reading %q on the retry: %q, %v", s, p, err)
		}
	}
	send("first message")
	tb.closeFor(first) // the first attempt's stop, late
	tb.settle()        // the retry's response has arrived
	send("second message")
	if tb.closed.Load() {
		t.Fatal("the body is closed under the retry")
	}
	// The retry's own close, once it has read the body, is real.
	tb.closeFor(tb.attemptNo())
	if !tb.closed.Load() {
		t.Fatal("the retry's close of the body it read did not close it")
	}
}
