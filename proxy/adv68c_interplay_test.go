package proxy

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/backpressure"
	"github.com/orbitproxy/orbit/governor"
	"github.com/orbitproxy/orbit/orbitpool"
)

// TestAdv68cUnansweredNotResent: an unpooled connection (fresh, as
// net/http's would be) whose upstream reads the request and closes without
// an answer fails the request once: net/http does not send a request again
// on a fresh connection, and the upstream must see it once.
func TestAdv68cUnansweredNotResent(t *testing.T) {
	spec := orbitpool.PoolSpec{Lanes: 1, Keys: 4, ResourcesPerLane: 2}
	release := make(chan struct{})
	defer close(release)
	var seen atomic.Int64
	url := rawUpstream(t, func(c net.Conn, br *bufio.Reader, req *http.Request) bool {
		switch req.URL.Path {
		case "/stream":
			io.WriteString(c, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n")
			<-release
			return false
		}
		seen.Add(1)
		c.Close() // closed unanswered
		return false
	})
	m := newMember(t, spec, nil)
	holdStreams(t, m, url, 2)
	_, _, err := adv10Do(t, m.tr, "GET", url+"/x", nil)
	if err == nil {
		t.Fatal("served without an answer")
	}
	time.Sleep(200 * time.Millisecond)
	if n := seen.Load(); n != 1 {
		t.Fatalf("the upstream saw the request %d times, want once (%v)", n, err)
	}
	if m.node.open.Load() != 2 {
		t.Fatalf("open %d, want the 2 held", m.node.open.Load())
	}
}

// TestAdv68cDialFailsClean: with the table full, an unpooled dial refused by
// the upstream fails the request with the dial's error, and gives back the
// permit, the worker and the dialing count.
func TestAdv68cDialFailsClean(t *testing.T) {
	spec := orbitpool.PoolSpec{Lanes: 1, Keys: 4, ResourcesPerLane: 2}
	release, closed := make(chan struct{}), make(chan bool, 4)
	defer close(release)
	url := unpooledUpstream(t, release, closed)
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	dead := "http://" + ln.Addr().String()
	ln.Close()
	gov := governor.New(8, 0)
	lim := backpressure.New(backpressure.WithCap(8))
	m := newMemberOpts(t, spec, NodeOptions{SweepInterval: 50 * time.Millisecond, Governor: gov},
		func(tr *Transport) { tr.Limiter = lim })
	holdStreams(t, m, url, 2)
	for range 5 {
		_, _, err := adv10Do(t, m.tr, "GET", dead+"/x", nil)
		if err == nil || errors.Is(err, orbitpool.ErrFull) {
			t.Fatalf("a refused dial: %v", err)
		}
	}
	if lim.Active() != 2 || gov.Outstanding() != 2 || m.node.dialing.Load() != 0 || m.node.open.Load() != 2 {
		t.Fatalf("after refused unpooled dials: permits %d, workers %d, dialing %d, open %d; want 2, 2, 0, 2",
			lim.Active(), gov.Outstanding(), m.node.dialing.Load(), m.node.open.Load())
	}
}

// TestAdv68cRaceForSlots: many requests race for a table of two slots; every
// one is served (pooled or not), and once they end the next request is
// pooled and reuses a connection; the counts and goroutines come back.
func TestAdv68cRaceForSlots(t *testing.T) {
	spec := orbitpool.PoolSpec{Lanes: 1, Keys: 4, ResourcesPerLane: 2}
	var conns atomic.Int64
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(time.Millisecond)
		io.WriteString(w, "ok")
	}))
	up.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	up.Start()
	defer up.Close()
	gov := governor.New(64, 0)
	lim := backpressure.New(backpressure.WithCap(64))
	m := newMemberOpts(t, spec, NodeOptions{SweepInterval: 50 * time.Millisecond, Governor: gov},
		func(tr *Transport) { tr.Limiter = lim })
	base := runtime.NumGoroutine()
	var wg sync.WaitGroup
	var failed atomic.Int64
	var firstErr atomic.Value
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 25 {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				req, _ := http.NewRequestWithContext(ctx, "GET", up.URL+"/", nil)
				resp, err := m.tr.RoundTrip(req)
				if err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
					cancel()
					continue
				}
				b, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				if err != nil || string(b) != "ok" {
					failed.Add(1)
				}
				cancel()
			}
		}()
	}
	wg.Wait()
	if n := failed.Load(); n != 0 {
		t.Fatalf("%d of 400 requests failed, first: %v", n, firstErr.Load())
	}
	s := m.node.Stats()
	if s.Unpooled == 0 {
		t.Logf("no request went unpooled (stats %+v)", s)
	}
	// Every connection open is in the table or kept idle outside it.
	waitFor(t, 3*time.Second, "open back to the pooled and kept ones", func() bool {
		return m.node.open.Load() == int64(m.node.Stats().OpenConns)
	})
	before := m.node.Stats()
	if _, body, err := adv10Do(t, m.tr, "GET", up.URL+"/", nil); err != nil || body != "ok" {
		t.Fatal(err)
	}
	after := m.node.Stats()
	if after.Unpooled != before.Unpooled || after.ReusedLocal+after.Created == before.ReusedLocal+before.Created {
		t.Fatalf("after the race a request was not pooled: %+v -> %+v", before, after)
	}
	if lim.Active() != 0 || gov.Outstanding() != 0 {
		t.Fatalf("permits %d workers %d left held", lim.Active(), gov.Outstanding())
	}
	waitFor(t, 5*time.Second, "goroutines back", func() bool { return runtime.NumGoroutine() <= base+4 })
}

// TestAdv68cCloseDuringUnpooled: Node.Close while an unpooled exchange's
// body is streaming returns promptly, and the exchange then ends (its body
// read returns) once the upstream finishes, its connection closed.
func TestAdv68cCloseDuringUnpooled(t *testing.T) {
	spec := orbitpool.PoolSpec{Lanes: 1, Keys: 4, ResourcesPerLane: 2}
	release, closed := make(chan struct{}), make(chan bool, 4)
	url := unpooledUpstream(t, release, closed)
	m := newMember(t, spec, nil)
	holdStreams(t, m, url, 2)
	req, _ := http.NewRequest("GET", url+"/stream", nil)
	resp, err := m.tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	if m.node.Stats().Unpooled != 1 {
		t.Fatal("the third stream was not unpooled")
	}
	done := make(chan struct{})
	go func() { m.node.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Node.Close hung on an unpooled exchange")
	}
	close(release)
	rd := make(chan error, 1)
	go func() { _, err := io.ReadAll(resp.Body); rd <- err }()
	select {
	case <-rd:
	case <-time.After(5 * time.Second):
		t.Fatal("the unpooled body never ended after Close")
	}
	resp.Body.Close()
	waitFor(t, 3*time.Second, "open back to 0", func() bool { return m.node.open.Load() == 0 })
}

// TestAdv68cSiblingKeysFull: the keys table is the fleet's: with every entry
// held by a sibling's connections, this process's request to a new upstream
// is served on a connection of its own.
func TestAdv68cSiblingKeysFull(t *testing.T) {
	spec := orbitpool.PoolSpec{Lanes: 2, Keys: 2, ResourcesPerLane: 8, Path: filepath.Join(t.TempDir(), "seg")}
	rel := make(chan struct{})
	defer close(rel)
	closed := make(chan bool, 8)
	u1 := unpooledUpstream(t, rel, closed)
	u2 := unpooledUpstream(t, rel, closed)
	u3 := unpooledUpstream(t, rel, closed)
	a := newMember(t, spec, nil)
	b := newMember(t, spec, nil)
	holdStreams(t, a, u1, 1)
	holdStreams(t, a, u2, 1)
	if _, body, err := adv10Do(t, b.tr, "GET", u3+"/once", nil); err != nil || body != "ok" {
		t.Fatalf("a sibling's request to a third upstream with the keys full: %q, %v", body, err)
	}
	b.tr.CloseIdleConnections() // and the connection kept outside the table
	if c := <-closed; !c {
		t.Fatal("not closed")
	}
	if b.node.Stats().Unpooled != 1 {
		t.Fatalf("stats %+v", b.node.Stats())
	}
}

// TestAdv68cH2CFullWaits: an h2c upstream is never unpooled: with the table
// full its request waits for room, dials nothing, and fails with the
// table's error when its time runs out.
func TestAdv68cH2CFullWaits(t *testing.T) {
	spec := orbitpool.PoolSpec{Lanes: 1, Keys: 4, ResourcesPerLane: 2}
	release, closed := make(chan struct{}), make(chan bool, 4)
	defer close(release)
	url := unpooledUpstream(t, release, closed)
	s := newH2CServer(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	m := newMember(t, spec, func(tr *Transport) { tr.H2C = true; tr.HTTP2 = true })
	// The held streams are h1: a second transport on the same node.
	h1 := &Transport{Node: m.node}
	holdStreams(t, &member{pool: m.pool, node: m.node, tr: h1}, url, 2)
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", s.url+"/", nil)
	_, err := m.tr.RoundTrip(req)
	if !errors.Is(err, orbitpool.ErrFull) || time.Since(start) < 100*time.Millisecond {
		t.Fatalf("h2c with the table full: %v after %v; want the table's error after a wait", err, time.Since(start))
	}
	if s.conns.Load() != 0 || m.node.Stats().Unpooled != 0 {
		t.Fatalf("h2c dialed %d", s.conns.Load())
	}
}
