package proxy

import (
	"context"
	"net/http"
	"testing"
	"time"
)

// TestAdv14UsableH2FullNotDrained: usableH2 drains a connection that cannot
// take a request any more, at once, but not one that is merely full (its
// one stream, the peer's limit, running): that one stays usable and keeps
// its pool capacity, whatever CanTakeNewRequest says of a full connection
// (x/net's wrapper of net/http's client, built with Go 1.27, says false).
// One that got GOAWAY has capacity 0 at once and leaves the pool once its
// stream ends.
func TestAdv14UsableH2FullNotDrained(t *testing.T) {
	up := newH2Upstream(t, 1)
	owner, _ := remotePair(t, h2cConf)
	warmH2(t, owner, up.url)
	key := mustKey(t, owner.tr, up.url)
	hc := installedH2(t, owner)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := owner.tr.RoundTrip(grpcReq(t, ctx, up.url+"/hold", http.NoBody))
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the held stream to reach the upstream", func() bool { return up.cur.Load() == 1 })
	if !owner.node.usableH2(hc) || hc.isDraining() {
		t.Fatalf("a connection full at its peer's limit of 1: usableH2 false or draining %v; want it usable", hc.isDraining())
	}
	if cs, _ := owner.pool.Candidates(key, nil); len(cs) != 1 || cs[0].Capacity != 1 {
		t.Fatalf("candidates %+v: want one, capacity 1", cs)
	}

	up.goAway()
	waitFor(t, 5*time.Second, "the ClientConn to see the GOAWAY", func() bool { return !hc.cc.CanTakeNewRequest() })
	// x/net's wrapper (h2Wrapped) tells a GOAWAY only once the connection
	// has closed: one that got it while full looks full, and what decides
	// there is that it leaves the pool once its stream ends (below).
	if !h2Wrapped {
		if owner.node.usableH2(hc) {
			t.Fatal("usableH2 true after GOAWAY")
		}
		if cs, _ := owner.pool.Candidates(key, nil); len(cs) != 1 || cs[0].Capacity != 0 {
			t.Fatalf("after GOAWAY, with the stream still running: candidates %+v; want one, capacity 0", cs)
		}
	}
	cancel()
	drain(resp)
	waitFor(t, 5*time.Second, "the drained connection to leave the pool", func() bool { return owner.pool.Live(key) == 0 })
}

// TestAdv14UsableH2ClosedRetiresAtOnce: a ClientConn closed under the pool
// (the upstream went) is retired at once by usableH2, its unit back before
// closeWait: a retirement in good order must not wait on a socket already
// gone.
func TestAdv14UsableH2ClosedRetiresAtOnce(t *testing.T) {
	up := newH2Upstream(t, 10)
	owner, _ := remotePair(t, h2cConf)
	warmH2(t, owner, up.url)
	key := mustKey(t, owner.tr, up.url)
	hc := installedH2(t, owner)
	up.close()
	waitFor(t, 5*time.Second, "the ClientConn to close", func() bool { return !hc.cc.CanTakeNewRequest() })
	// Mostly still installed here; the follower may have retired it first.
	t.Logf("installed when usableH2 runs: %v", owner.node.h2slots[hc.id.Slot()].Load() == hc)
	start := time.Now()
	if owner.node.usableH2(hc) {
		t.Fatal("usableH2 true on a closed ClientConn")
	}
	waitFor(t, 5*time.Second, "the closed connection to leave the pool", func() bool { return owner.pool.Live(key) == 0 })
	if d := time.Since(start); d >= closeWait {
		t.Fatalf("a closed connection left the pool after %v; want before closeWait (%v)", d, closeWait)
	}
}

// installedH2 is m's one installed HTTP/2 connection.
func installedH2(t *testing.T, m *member) *h2conn {
	t.Helper()
	for i := range m.node.h2slots {
		if c := m.node.h2slots[i].Load(); c != nil {
			return c
		}
	}
	t.Fatal("no HTTP/2 connection installed")
	return nil
}
