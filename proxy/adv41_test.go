package proxy

import (
	"context"
	"net/http"
	"testing"
	"time"
)

// TestAdv41H2RefusedWhileFullNotKeptOff: the owner refuses a sibling's
// lease on its HTTP/2 connection as gone (acceptH2) whenever the
// ClientConn cannot take a stream now: merely full, as when a stream that
// ended in the pool's view still counts there (a stream reset here counts
// until the peer answers a PING). The connection stays in the pool, and its
// capacity comes back (pauseH2, then the state's reading). Under a cap of
// one connection, the sibling's request must be served once the connection
// has room again; keeping off the connection for good, it waits out its
// deadline.
func TestAdv41H2RefusedWhileFullNotKeptOff(t *testing.T) {
	up := newH2Upstream(t, 1)
	owner, client := remotePair(t, h2cConf)
	req := grpcReq(t, context.Background(), up.url+"/unary", http.NoBody)
	resp, err := owner.tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	drain(resp)
	var hc *h2conn
	for i := range owner.node.h2slots {
		if c := owner.node.h2slots[i].Load(); c != nil {
			hc = c
		}
	}
	if hc == nil {
		t.Fatal("no HTTP/2 connection in the owner")
	}
	// An earlier stream failed before its response (useH2 marks the
	// connection lingering), and a stream the ClientConn counts and the
	// pool does not: the window of a stream that ended here, held open.
	hc.lingering.Store(true)
	hctx, hcancel := context.WithCancel(context.Background())
	held := make(chan struct{})
	go func() {
		defer close(held)
		resp, err := hc.cc.RoundTrip(grpcReq(t, hctx, up.url+"/hold", http.NoBody))
		if err == nil {
			drain(resp)
		}
	}()
	defer func() { hcancel(); <-held }()
	waitFor(t, 2*time.Second, "the held stream to run", func() bool { return up.cur.Load() == 1 })

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	done := make(chan error, 1)
	start := time.Now()
	go func() {
		resp, err := client.tr.RoundTrip(grpcReq(t, ctx, up.url+"/unary", http.NoBody))
		if err == nil {
			drain(resp)
		}
		done <- err
	}()
	// Under x/net's wrapper (h2Wrapped, Go 1.27) the owner refuses the
	// sibling's lease as gone (usableH2: full, and a stream may linger);
	// x/net's own client takes it, and the stream waits in the ClientConn.
	// Then the connection has room again.
	for end := time.Now().Add(time.Second); time.Now().Before(end) && owner.node.Stats().Refused == 0; {
		time.Sleep(5 * time.Millisecond)
	}
	if h2Wrapped && owner.node.Stats().Refused == 0 {
		t.Errorf("h2Wrapped: the owner did not refuse the lease on its full connection; the test no longer sets the case up")
	}
	hcancel()
	<-held
	if err := <-done; err != nil {
		t.Errorf("the sibling's request failed after %v although the connection had room again within ms of the refusal: %v; owner %+v client %+v",
			time.Since(start).Round(time.Millisecond), err, owner.node.Stats(), client.node.Stats())
	}
}
