package proxy

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// closeFirstUpstream closes its first connection after one answer, without
// saying so: the next request on it finds it closed while idle. It serves
// the others for as long as their clients keep them.
func closeFirstUpstream(t *testing.T) string {
	t.Helper()
	var accepted atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "2")
		io.WriteString(w, "ok")
		if first, _ := r.Context().Value(firstConnKey{}).(bool); first {
			w.(http.Flusher).Flush()
			if c, _, err := w.(http.Hijacker).Hijack(); err == nil {
				c.Close()
			}
		}
	}))
	srv.Config.ConnContext = func(ctx context.Context, _ net.Conn) context.Context {
		return context.WithValue(ctx, firstConnKey{}, accepted.Add(1) == 1)
	}
	srv.Start()
	t.Cleanup(srv.Close)
	return srv.URL
}

type firstConnKey struct{}

// TestRetryKeepsOffConnectionLeavingPool: between a dead connection's
// leaving its owner's slots and its unregistering, the pool still offers
// it, with room, and its owner refuses it as gone, locally and to siblings.
// A request must take it at most once: a sibling's retries used to take it
// again at once, each refused as fast, and spent the request's retries in a
// millisecond; the request failed with "the connection is gone" where
// net/http dials. Locally, the request spun on it. Kept off, each waits for
// its unit and dials.
func TestRetryKeepsOffConnectionLeavingPool(t *testing.T) {
	url := closeFirstUpstream(t)
	spec := testSpec
	spec.Path = filepath.Join(t.TempDir(), "seg")
	capOne := func(tr *Transport) { tr.MaxConnsPerKey = 1 }
	owner := newMemberOpts(t, spec, NodeOptions{SweepInterval: 5 * time.Millisecond}, capOne)
	client := newMemberOpts(t, spec, NodeOptions{SweepInterval: time.Hour}, capOne)

	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	hook := func(*owned) {
		once.Do(func() {
			close(entered)
			select {
			case <-release:
			case <-time.After(5 * time.Second):
			}
		})
	}
	testHookRetire.Store(&hook)
	defer testHookRetire.Store(nil)
	var releaseOnce sync.Once
	defer releaseOnce.Do(func() { close(release) })

	warm(t, owner, url)
	select {
	case <-entered: // the sweep found the connection closed; it is held in the window
	case <-time.After(5 * time.Second):
		t.Fatal("the owner's sweep never retired the connection the upstream closed")
	}

	errs := make(chan error, 2)
	send := func(m *member) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
		resp, err := m.tr.RoundTrip(req)
		if err == nil {
			drain(resp)
			resp.Body.Close()
		}
		errs <- err
	}
	// The sibling first, until its lease is refused as gone; then the
	// owner's own request.
	go send(client)
	for start := time.Now(); client.node.Stats().Retries == 0 && time.Since(start) < 2*time.Second; {
		time.Sleep(time.Millisecond)
	}
	go send(owner)
	time.Sleep(50 * time.Millisecond)
	snap, err := owner.pool.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	var taken uint64
	for _, k := range snap.Keys {
		taken += k.ReusedLocal + k.ReusedRemote
	}
	releaseOnce.Do(func() { close(release) })
	for range 2 {
		if err := <-errs; err != nil {
			t.Errorf("request failed: %v", err)
		}
	}
	if taken > 2 {
		t.Errorf("the connection leaving the pool was taken %d times in 50ms by two requests; want at most once each", taken)
	}
	if r := client.node.Stats().Retries; r != 1 {
		t.Errorf("the sibling's request was retried %d times; want once, after the refusal as gone", r)
	}
}

// TestIdleCloseRacesServed: an upstream that closes idle connections soon
// after each answer, swept often, races every way a connection leaves the
// pool (the sweep, a take that finds it closed, the owner's refusal of a
// sibling's lease) against the requests of two processes that share one
// connection: no request may fail, plain or TLS, as none fails through
// net/http's pool.
func TestIdleCloseRacesServed(t *testing.T) {
	for _, useTLS := range []bool{false, true} {
		srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, "ok")
		}))
		srv.Config.IdleTimeout = 3 * time.Millisecond
		if useTLS {
			srv.StartTLS()
		} else {
			srv.Start()
		}
		t.Cleanup(srv.Close)
		conf := func(tr *Transport) {
			tr.MaxConnsPerKey = 1
			tr.TLSClientConfig = &tls.Config{InsecureSkipVerify: true}
		}
		spec := testSpec
		spec.Path = filepath.Join(t.TempDir(), "seg")
		sweep := NodeOptions{SweepInterval: 500 * time.Microsecond}
		ms := []*member{newMemberOpts(t, spec, sweep, conf), newMemberOpts(t, spec, sweep, conf)}
		failed := 0
		for i := range 300 {
			for _, m := range ms {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL, nil)
				resp, err := m.tr.RoundTrip(req)
				if err == nil {
					drain(resp)
					resp.Body.Close()
				} else if failed++; failed <= 3 {
					t.Errorf("tls %v, round %d: %v", useTLS, i, err)
				}
				cancel()
				// Gaps of 0 to 3.5ms: before, around and after the
				// upstream's idle close.
				time.Sleep(time.Duration(i%8) * time.Millisecond / 2)
			}
		}
		if failed > 0 {
			t.Errorf("tls %v: %d of 600 requests failed", useTLS, failed)
		}
	}
}

// TestSiblingRetriesPastEveryClosedConnection: an upstream that restarts
// closes every idle connection at once. A sibling's request that meets them
// one after another, each refused by its owner as gone, must be served, as
// net/http serves a request past every dead connection of its pool: each
// refusal takes one connection out of the request's way, so the retries
// end. It failed after the fourth, the first refusal of a lane being the
// only free one.
func TestSiblingRetriesPastEveryClosedConnection(t *testing.T) {
	const conns = 8
	var inFlight sync.WaitGroup
	inFlight.Add(conns)
	gate := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/hold" {
			inFlight.Done()
			<-gate
		}
		io.WriteString(w, "ok")
	}))
	defer srv.Close()
	spec := testSpec
	spec.Path = filepath.Join(t.TempDir(), "seg")
	owner := newMemberOpts(t, spec, NodeOptions{SweepInterval: time.Hour}, nil)
	client := newMemberOpts(t, spec, NodeOptions{SweepInterval: time.Hour}, nil)

	// The owner opens conns connections, all idle once their requests end.
	var wg sync.WaitGroup
	for range conns {
		wg.Go(func() {
			req, _ := http.NewRequest("GET", srv.URL+"/hold", nil)
			if resp, err := owner.tr.RoundTrip(req); err == nil {
				drain(resp)
				resp.Body.Close()
			}
		})
	}
	inFlight.Wait()
	close(gate)
	wg.Wait()
	if n := owner.node.Stats().OpenConns; n != conns {
		t.Fatalf("owner holds %d connections; want %d", n, conns)
	}
	// The upstream restarts: every idle connection closes.
	srv.CloseClientConnections()
	time.Sleep(20 * time.Millisecond)

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL, nil)
	resp, err := client.tr.RoundTrip(req)
	if err != nil {
		t.Fatalf("request failed after %d retries: %v", client.node.Stats().Retries, err)
	}
	drain(resp)
	resp.Body.Close()
	if r := client.node.Stats().Retries; r > conns {
		t.Errorf("%d retries for %d closed connections", r, conns)
	}
}
