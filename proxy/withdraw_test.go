package proxy

import (
	"context"
	"net"
	"testing"
	"time"
)

// brokenWriter fails every write, as a stream closed under it does.
type brokenWriter struct{}

func (brokenWriter) Write([]byte) (int, error) { return 0, net.ErrClosed }

// TestUndeliveredLeaseFreesItsUnit: with one connection allowed, a
// sibling's lease that cannot be delivered (its idle stream to the owner
// breaks under the write) is withdrawn, so the retry finds the connection free at once
// rather than after the owner ages the reservation out (a second, by
// default).
func TestUndeliveredLeaseFreesItsUnit(t *testing.T) {
	u := newTestUpstream(t)
	owner, client := pairWithIdleStream(t, u)
	// The look before reuse sees nothing wrong, and the write of the lease
	// fails, as on a stream closed under it.
	idleStreamTo(t, client, owner).cw.w = brokenWriter{}

	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	start := time.Now()
	resp, err := get(t, ctx, client.tr, u.url("/cl"))
	if err != nil {
		t.Fatalf("a request whose first lease could not be delivered: %v after %v", err, time.Since(start))
	}
	drain(resp)
	if st := client.node.Stats(); st.Retries != 1 {
		t.Errorf("%d retries, want 1", st.Retries)
	}
}
