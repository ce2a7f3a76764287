package proxy

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"
)

// TestAdv12GapCloseIdleSparesBusyH2: CloseIdleConnections retires only an
// HTTP/2 connection with no stream in flight and no unit reserved or in use,
// as net/http's closes only a ClientConn with no stream and no reservation.
// Here a request takes the connection's unit and starts its stream just as
// CloseIdleConnections has found the connection idle (the hook makes the
// interleaving certain). The connection must stay in the pool with its
// capacity, not be drained under the stream, and carry the next request.
func TestAdv12GapCloseIdleSparesBusyH2(t *testing.T) {
	up := newH2Upstream(t, 100)
	m := newMemberOpts(t, testSpecLocal, NodeOptions{SweepInterval: time.Hour}, h2cConf)
	hold := func(ctx context.Context) (*http.Response, error) {
		return m.tr.RoundTrip(grpcReq(t, ctx, up.url+"/hold", http.NoBody))
	}
	// The connection, idle.
	resp, err := m.tr.RoundTrip(grpcReq(t, context.Background(), up.url+"/unary", http.NoBody))
	if err != nil {
		t.Fatal(err)
	}
	drain(resp)
	key := mustKey(t, m.tr, up.url)
	capacityBack(t, m, up.url)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var (
		once    sync.Once
		held    *http.Response
		heldErr error
	)
	h := func(*h2conn) {
		once.Do(func() {
			// A request that got here first: its stream is open
			// upstream (the handler flushed its head) when the hook
			// returns.
			held, heldErr = hold(ctx)
		})
	}
	testHookCloseIdleH2.Store(&h)
	t.Cleanup(func() { testHookCloseIdleH2.Store(nil) })
	m.tr.CloseIdleConnections()
	testHookCloseIdleH2.Store(nil)
	if heldErr != nil {
		t.Fatalf("the request racing CloseIdleConnections failed: %v", heldErr)
	}
	if held == nil {
		t.Fatal("the hook did not run: the connection did not look idle")
	}
	c, err := m.pool.Candidates(key, nil)
	if err != nil || len(c) != 1 || c[0].Capacity == 0 {
		t.Errorf("after CloseIdleConnections under a stream: %+v, %v; want the one connection still offered", c, err)
	}
	if hc := m.node.lookupH2(c[0].ID); hc == nil || hc.isDraining() {
		t.Errorf("the busy connection was retired by CloseIdleConnections (draining %v)", hc != nil)
	}
	held.Body.Close()
	capacityBack(t, m, up.url)
	resp, err = m.tr.RoundTrip(grpcReq(t, context.Background(), up.url+"/unary", http.NoBody))
	if err != nil {
		t.Fatal(err)
	}
	drain(resp)
	if n := up.conns.Load(); n != 1 {
		t.Errorf("the upstream saw %d connections; want 1: the connection busy at CloseIdleConnections carries the next request", n)
	}
	// Now idle: CloseIdleConnections retires it.
	m.tr.CloseIdleConnections()
	waitFor(t, 5*time.Second, "the idle connection to leave the pool", func() bool {
		c, _ := m.pool.Candidates(key, nil)
		return len(c) == 0
	})
}
