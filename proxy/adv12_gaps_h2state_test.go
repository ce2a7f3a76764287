package proxy

import (
	"context"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"golang.org/x/net/http2"
)

// newStuckH2 is an h2c upstream that grants a large flow-control window,
// answers SETTINGS and PING, and stops reading its connection at a
// request's HEADERS, until release is closed: a client writing that
// request's body fills the socket's buffers and blocks in the write, which
// x/net/http2 makes holding its ClientConn's write lock.
func newStuckH2(t *testing.T, release <-chan struct{}) string {
	t.Helper()
	return newStuckH2With(t, func(*http2.Framer, *http2.HeadersFrame, int) { <-release })
}

// newStuckH2With is newStuckH2 that runs onHeaders, given the connection's
// number (from 1), at the first request's HEADERS instead.
func newStuckH2With(t *testing.T, onHeaders func(fr *http2.Framer, f *http2.HeadersFrame, conn int)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	serveConns(t, ln, func(c net.Conn, id int) {
		if tc, ok := c.(*net.TCPConn); ok {
			tc.SetReadBuffer(4 << 10)
		}
		serveH2Frames(c, []http2.Setting{{ID: http2.SettingMaxConcurrentStreams, Val: 100},
			{ID: http2.SettingInitialWindowSize, Val: 1 << 30}},
			func(fr *http2.Framer, f *http2.HeadersFrame) { onHeaders(fr, f, id) })
	})
	return "http://" + ln.Addr().String()
}

// TestAdv12GapSweepNotStalledByBlockedH2Write: one HTTP/2 connection's
// write is blocked (its upstream stopped reading under a request body, and
// nothing bounds the write). x/net/http2's ClientConn.State takes the
// write lock, so a sweep that read that connection's state there stalled
// behind the write, and with it every other connection's idle check: here
// a second connection, idle past its 100ms idle timeout, must still leave
// the pool while the first stays blocked.
func TestAdv12GapSweepNotStalledByBlockedH2Write(t *testing.T) {
	release := make(chan struct{})
	defer close(release) // before the member's cleanup: the write ends with it
	stuck := newStuckH2(t, release)
	up := newH2Upstream(t, 100)
	m := newMemberOpts(t, testSpecLocal, NodeOptions{SweepInterval: 20 * time.Millisecond}, func(tr *Transport) {
		tr.H2C = true
		tr.IdleConnTimeout = 100 * time.Millisecond
	})

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	blocked := make(chan error, 1)
	go func() {
		req := grpcReq(t, ctx, stuck+"/upload", io.NopCloser(zeros{}))
		resp, err := m.tr.RoundTrip(req)
		if resp != nil {
			resp.Body.Close()
		}
		blocked <- err
	}()
	stuckKey := mustKey(t, m.tr, stuck)
	waitFor(t, 5*time.Second, "the blocked upload's connection", func() bool {
		c, _ := m.pool.Candidates(stuckKey, nil)
		return len(c) == 1 && c[0].InUse == 1
	})

	resp, err := m.tr.RoundTrip(grpcReq(t, context.Background(), up.url+"/unary", http.NoBody))
	if err != nil {
		t.Fatal(err)
	}
	drain(resp)
	key := mustKey(t, m.tr, up.url)
	deadline := time.Now().Add(5 * time.Second)
	for {
		c, _ := m.pool.Candidates(key, nil)
		if len(c) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the idle connection is still in the pool 5s past its 100ms idle timeout: %+v; the sweep stalled behind the blocked write", c)
		}
		time.Sleep(5 * time.Millisecond)
	}
	select {
	case err := <-blocked:
		t.Fatalf("the upload ended (%v); want it blocked for the whole test", err)
	default:
	}
}
