package proxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/orbitpool"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// unpooledUpstream answers /stream with a chunked body that ends only once
// release is closed, /ws with a 101 and an echo of what follows, /conn with
// the address of the connection's client (which it keeps open), /drop with
// "ok" on a connection it then closes, and anything else with "ok", then
// reports on closed whether the proxy closed that connection (its next read
// is EOF within 2s).
func unpooledUpstream(t *testing.T, release chan struct{}, closed chan bool) string {
	return rawUpstream(t, func(c net.Conn, br *bufio.Reader, req *http.Request) bool {
		switch req.URL.Path {
		case "/stream":
			io.WriteString(c, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n")
			<-release
			io.WriteString(c, "0\r\n\r\n")
			return true
		case "/ws":
			io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
			io.Copy(c, br)
			return false
		case "/conn":
			a := c.RemoteAddr().String()
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(a), a)
			return true
		case "/drop":
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
			c.Close()
			return false
		}
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		_, err := br.ReadByte()
		closed <- errors.Is(err, io.EOF)
		return false
	})
}

// holdStreams starts n /stream exchanges and returns their responses, whose
// bodies hold a connection each until read to their end.
func holdStreams(t *testing.T, m *member, url string, n int) []*http.Response {
	t.Helper()
	var held []*http.Response
	for range n {
		req, _ := http.NewRequest("GET", url+"/stream", nil)
		resp, err := m.tr.RoundTrip(req)
		if err != nil {
			t.Fatalf("a stream: %v", err)
		}
		held = append(held, resp)
		t.Cleanup(func() { resp.Body.Close() })
	}
	return held
}

// TestUnpooledWhenTheTableIsFull: a process whose lane has no room for
// another connection (every slot held by a long-lived exchange) sends a
// request to an upstream under no cap on a connection of its own, outside
// the table, and keeps that connection idle for the next such request, as
// the stock transport would; a 101 on such a connection keeps it for the
// tunnel. Once the table has room, requests take pooled connections again.
// Under a cap the table alone counts connections: the request waits for one
// of its upstream's, or for room, and fails with the table's error if
// neither comes in time.
func TestUnpooledWhenTheTableIsFull(t *testing.T) {
	spec := orbitpool.PoolSpec{Lanes: 1, Keys: 4, ResourcesPerLane: 2}
	t.Run("uncapped", func(t *testing.T) {
		release, closed := make(chan struct{}), make(chan bool, 4)
		url := unpooledUpstream(t, release, closed)
		core, logs := observer.New(zapcore.WarnLevel)
		m := newMemberOpts(t, spec, NodeOptions{SweepInterval: 50 * time.Millisecond, Logger: zap.New(core)}, nil)
		held := holdStreams(t, m, url, 2)

		var first string
		for i := range 2 {
			_, body, err := adv10Do(t, m.tr, "GET", url+"/conn", nil)
			if err != nil || body == "" || i == 1 && body != first {
				t.Fatalf("request %d with the table full: %q, %v; want it on the connection of request 0, %q", i, body, err, first)
			}
			first = body
			if i == 0 {
				// As if the warning's tableFullLogEvery had passed: the
				// next request warns too, on the kept connection.
				m.node.tableFullLogged.Store(0)
			}
		}
		if s := m.node.Stats(); s.Unpooled != 2 || s.OpenConns != 3 {
			t.Fatalf("stats %+v: want 2 requests unpooled, the 2 held connections open and one outside the table", s)
		}
		if n := logs.FilterMessageSnippet("outside it, not shared with its siblings").Len(); n != 2 {
			t.Fatalf("%d warnings of requests outside the table; want one for each", n)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", url+"/ws", nil)
		req.Header.Set("Connection", "Upgrade")
		req.Header.Set("Upgrade", "echo")
		resp, err := m.tr.RoundTrip(req)
		if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
			t.Fatalf("an upgrade with the table full: %v, %v", resp, err)
		}
		tunnel, ok := resp.Body.(io.ReadWriteCloser)
		if !ok {
			t.Fatal("the 101's body is not writable")
		}
		if _, err := io.WriteString(tunnel, "ping"); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, 4)
		if _, err := io.ReadFull(tunnel, got); err != nil || string(got) != "ping" {
			t.Fatalf("the tunnel echoed %q, %v", got, err)
		}
		tunnel.Close()

		close(release)
		for _, r := range held {
			if b, err := io.ReadAll(r.Body); err != nil || string(b) != "first" {
				t.Fatalf("a held stream read %q, %v", b, err)
			}
			r.Body.Close()
		}
		if _, body, err := adv10Do(t, m.tr, "GET", url+"/stream", nil); err != nil || body != "first" {
			t.Fatalf("a request once the table has room: %q, %v", body, err)
		}
		if s := m.node.Stats(); s.Unpooled != 3 || s.ReusedLocal == 0 {
			t.Fatalf("stats %+v: want the 3 requests unpooled (2 GETs, the upgrade) and then a pooled connection reused", s)
		}
	})
	t.Run("capped", func(t *testing.T) {
		capped := func(tr *Transport) { tr.MaxConnsPerKey = 8 }
		get := func(m *member, url string, wait time.Duration) (string, error) {
			ctx, cancel := context.WithTimeout(context.Background(), wait)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, "GET", url+"/once", nil)
			resp, err := m.tr.RoundTrip(req)
			if err != nil {
				return "", err
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			return string(b), err
		}
		t.Run("waits for the key's connection", func(t *testing.T) {
			release, closed := make(chan struct{}), make(chan bool, 4)
			url := unpooledUpstream(t, release, closed)
			core, logs := observer.New(zapcore.WarnLevel)
			m := newMemberOpts(t, spec, NodeOptions{SweepInterval: 50 * time.Millisecond, Logger: zap.New(core)}, capped)
			held := holdStreams(t, m, url, 2)
			type result struct {
				body string
				err  error
			}
			done := make(chan result, 1)
			go func() {
				body, err := get(m, url, 5*time.Second)
				done <- result{body, err}
			}()
			select {
			case r := <-done:
				t.Fatalf("the request returned (%q, %v) while both of its upstream's connections were held; want it to wait", r.body, r.err)
			case <-time.After(200 * time.Millisecond):
			}
			close(release)
			for _, r := range held {
				drain(r)
			}
			if r := <-done; r.err != nil || r.body != "ok" {
				t.Fatalf("the request that waited: %q, %v", r.body, r.err)
			}
			if s := m.node.Stats(); s.Unpooled != 0 || s.Created != 2 || s.ReusedLocal == 0 {
				t.Fatalf("stats %+v: want the request on one of the 2 connections it waited for, none outside the table", s)
			}
			if n := logs.FilterMessageSnippet("wait for room or a connection of theirs").Len(); n != 1 {
				t.Fatalf("%d warnings of the wait; want one", n)
			}
		})
		t.Run("none frees in time", func(t *testing.T) {
			release, closed := make(chan struct{}), make(chan bool, 4)
			defer close(release)
			url := unpooledUpstream(t, release, closed)
			m := newMember(t, spec, capped)
			holdStreams(t, m, url, 2)
			start := time.Now()
			_, err := get(m, url, 300*time.Millisecond)
			if !errors.Is(err, orbitpool.ErrFull) || !errors.Is(err, ErrNoCapacity) {
				t.Fatalf("a capped key's request whose connections stayed busy: %v; want the table's error, as a wait that ran out", err)
			}
			if d := time.Since(start); d < 100*time.Millisecond {
				t.Fatalf("refused after %v; want it to have waited", d)
			}
			if s := m.node.Stats(); s.Unpooled != 0 || s.Created != 2 {
				t.Fatalf("stats %+v: a capped key's request dialed", s)
			}
		})
		t.Run("room comes back", func(t *testing.T) {
			release, closed := make(chan struct{}), make(chan bool, 4)
			other := unpooledUpstream(t, release, closed)
			url := unpooledUpstream(t, release, closed)
			m := newMember(t, spec, capped)
			held := holdStreams(t, m, other, 2)
			done := make(chan error, 1)
			go func() {
				body, err := get(m, url, 5*time.Second)
				if err == nil && body != "ok" {
					err = fmt.Errorf("body %q", body)
				}
				done <- err
			}()
			select {
			case err := <-done:
				t.Fatalf("the request returned (%v) while the table was full of another upstream's connections; want it to wait", err)
			case <-time.After(200 * time.Millisecond):
			}
			close(release)
			for _, r := range held {
				drain(r)
			}
			if err := <-done; err != nil {
				t.Fatalf("the request that waited for room: %v", err)
			}
			if s := m.node.Stats(); s.Unpooled != 0 || s.Created != 3 || s.Evicted != 1 {
				t.Fatalf("stats %+v: want the request on a connection of its own in the table, made room for by an eviction", s)
			}
		})
	})
}

// TestSparesOutsideTheTable: a connection outside the table kept idle (see
// spares) is not used once its upstream closed it, and is closed by the
// sweep past the idle timeout, by CloseIdleConnections, and by Close.
func TestSparesOutsideTheTable(t *testing.T) {
	spec := orbitpool.PoolSpec{Lanes: 1, Keys: 4, ResourcesPerLane: 2}
	release, closed := make(chan struct{}), make(chan bool, 8)
	defer close(release)
	url := unpooledUpstream(t, release, closed)
	// The first sweep comes after the upstream closed the first spare:
	// the request after it finds the spare closed itself.
	m := newMemberOpts(t, spec, NodeOptions{SweepInterval: 250 * time.Millisecond}, func(tr *Transport) { tr.IdleConnTimeout = 300 * time.Millisecond })
	holdStreams(t, m, url, 2)
	open := func() int { return m.node.Stats().OpenConns }
	spare := func() {
		t.Helper()
		if _, body, err := adv10Do(t, m.tr, "GET", url+"/conn", nil); err != nil || body == "" {
			t.Fatalf("a request with the table full: %q, %v", body, err)
		}
		if n := open(); n != 3 {
			t.Fatalf("%d connections open; want the 2 held and one idle outside the table", n)
		}
	}

	if _, body, err := adv10Do(t, m.tr, "GET", url+"/drop", nil); err != nil || body != "ok" {
		t.Fatalf("a request with the table full: %q, %v", body, err)
	}
	// The upstream closed that connection while it was idle: the next
	// request dials.
	time.Sleep(50 * time.Millisecond)
	spare()
	if s := m.node.Stats(); s.Unpooled != 2 || s.Retries != 0 {
		t.Fatalf("stats %+v: want both requests served outside the table, neither sent again", s)
	}

	waitFor(t, 3*time.Second, "the sweep to close the idle connection outside the table", func() bool { return open() == 2 })

	spare()
	m.tr.CloseIdleConnections()
	if n := open(); n != 2 {
		t.Fatalf("%d connections open after CloseIdleConnections; want the 2 held", n)
	}

	spare()
	m.node.Close()
	if n := open(); n != 0 {
		t.Fatalf("%d connections open after Close", n)
	}
}

// TestUnpooledNotForAnHTTP2Upstream: with the table full, a request to an
// https upstream offered HTTP/2, which has not chosen HTTP/1.1 on a
// connection of this process, dials nothing outside the table (an HTTP/2
// connection carries many streams, and belongs in the table): it waits for
// room, and fails with the table's error if none comes in time.
func TestUnpooledNotForAnHTTP2Upstream(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	h1, tc := adv68cTLSH1(t, release)
	h2, dialed := h2TLSUpstream(t, tc)
	m := newMember(t, orbitpool.PoolSpec{Lanes: 1, Keys: 4, ResourcesPerLane: 2}, func(tr *Transport) {
		tr.HTTP2 = true
		tr.TLSClientConfig = tc
	})
	holdStreams(t, m, h1.URL, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", h2.URL+"/", nil)
	if _, err := m.tr.RoundTrip(req); !errors.Is(err, orbitpool.ErrFull) {
		t.Fatalf("a request to an HTTP/2 upstream with the table full: %v; want the table's error", err)
	}
	if n := dialed.Load(); n != 0 {
		t.Errorf("the HTTP/2 upstream saw %d connections; want none", n)
	}
	if s := m.node.Stats(); s.Unpooled != 0 {
		t.Errorf("stats %+v: a request went unpooled to an HTTP/2 upstream", s)
	}
}

// h2TLSUpstream is an https upstream that speaks HTTP/2, answers "ok", and
// counts the connections it accepts; tc trusts it.
func h2TLSUpstream(t *testing.T, tc *tls.Config) (*httptest.Server, *atomic.Int32) {
	var dialed atomic.Int32
	h2 := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	h2.EnableHTTP2 = true
	h2.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			dialed.Add(1)
		}
	}
	h2.StartTLS()
	t.Cleanup(h2.Close)
	tc.RootCAs.AddCert(h2.Certificate())
	return h2, &dialed
}

// TestFullTableEvictsTheLongestIdle: a process whose table is full of idle
// connections of one upstream retires the one idle longest to make room
// for another upstream's, as net/http's pool lets its least recently used
// idle connection go, rather than dial a connection outside the table for
// every request: the other upstream's requests then share one connection.
func TestFullTableEvictsTheLongestIdle(t *testing.T) {
	release, closed := make(chan struct{}), make(chan bool, 8)
	a := unpooledUpstream(t, release, closed)
	var mu sync.Mutex
	bConns := map[net.Conn]bool{}
	b := rawUpstream(t, func(c net.Conn, _ *bufio.Reader, req *http.Request) bool {
		mu.Lock()
		bConns[c] = true
		mu.Unlock()
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		return true
	})
	m := newMember(t, orbitpool.PoolSpec{Lanes: 1, Keys: 4, ResourcesPerLane: 2}, nil)
	held := holdStreams(t, m, a, 2)
	close(release)
	for _, r := range held {
		drain(r) // both of a's connections idle now
	}
	for i := range 3 {
		if _, body, err := adv10Do(t, m.tr, "GET", b+"/", nil); err != nil || body != "ok" {
			t.Fatalf("request %d to the other upstream: %q, %v", i, body, err)
		}
	}
	s := m.node.Stats()
	if s.Evicted != 1 || s.Unpooled != 0 || s.ReusedLocal < 2 {
		t.Errorf("stats %+v: want one idle connection evicted, none unpooled, and the other upstream's connection reused", s)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(bConns) != 1 || s.Created != 3 {
		t.Errorf("the other upstream saw requests on %d connections, %d created in all; want one of its own", len(bConns), s.Created)
	}
}
