package proxy

import (
	"context"
	"testing"
	"time"
)

// TestUndeliveredLeaseFreesItsUnit: with one connection allowed, a
// sibling's lease that cannot be delivered (its idle stream to the owner is
// broken) is withdrawn, so the retry finds the connection free at once
// rather than after the owner ages the reservation out (a second, by
// default).
func TestUndeliveredLeaseFreesItsUnit(t *testing.T) {
	u := newTestUpstream(t)
	owner, client := pairWithIdleStream(t, u)
	p := client.node.peers
	p.mu.Lock()
	idle := p.idle[owner.pool.Lane()]
	p.mu.Unlock()
	if len(idle) != 1 {
		t.Fatalf("%d idle streams to the owner, want 1", len(idle))
	}
	idle[0].nc.Close() // broken under the transport, which still takes it for idle

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
