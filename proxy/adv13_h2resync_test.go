package proxy

import (
	"context"
	"net/http"
	"testing"
	"time"
)

// TestAdv13ResyncBeforeFollowerRuns: the follower's read of a connection's
// state runs on a goroutine of its own (syncH2Off), which takes the syncing
// flag before it is scheduled. A stream that ends in between finds the
// flag taken and leaves its sync to that goroutine (resync). The follower's
// check (followH2) then runs first, and it looks only at the stream limit:
// the asked-for sync must still run after it. Here the stream was the last
// one of a draining connection, whose end is what retires it; the sweep is
// an hour away, so only that sync can.
func TestAdv13ResyncBeforeFollowerRuns(t *testing.T) {
	up := newH2Upstream(t, 100)
	m := newMemberOpts(t, testSpecLocal, NodeOptions{SweepInterval: time.Hour}, h2cConf)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	held, err := m.tr.RoundTrip(grpcReq(t, ctx, up.url+"/hold", http.NoBody))
	if err != nil {
		t.Fatal(err)
	}
	key := mustKey(t, m.tr, up.url)
	c, err := m.pool.Candidates(key, nil)
	if err != nil || len(c) != 1 {
		t.Fatalf("candidates %+v, %v; want the one connection", c, err)
	}
	hc := m.node.lookupH2(c[0].ID)
	if hc == nil {
		t.Fatal("the connection is not installed")
	}
	// Drained with its stream running (as CloseIdleConnections drains
	// every connection): it leaves once that stream ends.
	m.node.drainH2(hc)
	if m.node.lookupH2(hc.id) != hc {
		t.Fatal("drained under its stream")
	}
	// The follower has taken the flag for its goroutine, not yet running.
	// Wait for any read in flight (the follower woken by the stream) first.
	waitFor(t, 5*time.Second, "no state read in flight", func() bool {
		return hc.syncing.CompareAndSwap(false, true)
	})
	held.Body.Close() // the last stream ends: its sync is left to the runner
	m.node.runStateH2(hc, m.node.followH2)
	if m.node.lookupH2(hc.id) == hc {
		t.Fatalf("the draining connection is still installed after its last stream ended (active %d, resync %v): the end's sync was lost", hc.active.Load(), hc.resync.Load())
	}
}
