package proxy

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/internal/grpcmsg"
)

// TestAdv11H2IdleTimeoutAtUse: an HTTP/2 connection idle for longer than
// IdleConnTimeout takes no new stream, whenever the sweep next runs: an
// upstream with the same idle timeout may be closing it, and a stream sent
// then fails. x/net/http2's ClientConn, which enforced the timeout before
// the sweep did, refused such a connection (tooIdle) and closed it on time;
// an HTTP/1.1 connection is checked at take (expired). Here the sweep runs
// once an hour: the second request, 200ms after the first, must go out on
// a new connection.
func TestAdv11H2IdleTimeoutAtUse(t *testing.T) {
	up := newH2Upstream(t, 100)
	m := newMemberOpts(t, testSpec, NodeOptions{SweepInterval: time.Hour}, func(tr *Transport) {
		tr.H2C = true
		tr.IdleConnTimeout = 50 * time.Millisecond
	})
	unary := func() {
		t.Helper()
		req := grpcReq(t, context.Background(), up.url+"/unary", bytes.NewReader(grpcmsg.Frame([]byte("hello"))))
		resp, err := m.tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if p, err := grpcmsg.Read(resp.Body); err != nil || string(p) != "hello" {
			t.Fatalf("echoed %q, %v", p, err)
		}
	}
	unary()
	key := mustKey(t, m.tr, up.url)
	first, _ := m.pool.Candidates(key, nil)
	if len(first) != 1 {
		t.Fatalf("registered %+v, want one connection", first)
	}
	time.Sleep(200 * time.Millisecond)
	unary()
	if n := up.conns.Load(); n != 2 {
		t.Errorf("the upstream saw %d connections; want 2: the first, idle for 200ms past a 50ms idle timeout, carried the second request", n)
	}
	c, _ := m.pool.Candidates(key, nil)
	for _, r := range c {
		if r.ID == first[0].ID && r.Capacity > 0 {
			t.Errorf("the connection idle past its timeout is still offered: %+v", r)
		}
	}
}
