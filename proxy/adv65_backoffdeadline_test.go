package proxy

import (
	"context"
	"testing"
	"time"
)

// A wait that cannot end before the request's deadline does not begin: the
// retry it waits for could never be sent, and the caller would learn of the
// upstream's failure only at the deadline, as a deadline error (504 in
// Caddy), where at once it is a dial error reverse_proxy may send to another
// upstream. A wait that fits is waited out.
func TestAdv65BackoffDoesNotSleepIntoTheDeadline(t *testing.T) {
	tr := &Transport{}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	if tr.awayBackoff(ctx, 3, nil) { // a wait of 100ms
		t.Fatal("a 100ms wait began 50ms before the deadline and ended")
	}
	if took := time.Since(start); took > 40*time.Millisecond {
		t.Fatalf("the wait that could not fit took %v; want none", took)
	}
	start = time.Now()
	if !tr.awayBackoff(context.Background(), 1, nil) { // 25ms
		t.Fatal("a wait without a deadline failed")
	}
	if took := time.Since(start); took < awayBackoffBase {
		t.Fatalf("the first wait took %v; want at least %v", took, awayBackoffBase)
	}
}
