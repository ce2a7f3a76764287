package proxy

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/orbitpool"
)

func adv69bModes() []struct {
	name   string
	useTLS bool
} {
	return []struct {
		name   string
		useTLS bool
	}{{"plain", false}, {"tls", true}}
}

// TestAdv69bSpareLeftovers: a connection outside the table whose upstream
// sent more than its response (a second response in the same write, a body
// after a HEAD or a 204, a stray response after a 40 KiB body) is never
// reused: the next request gets its own answer, on another connection.
func TestAdv69bSpareLeftovers(t *testing.T) {
	for _, mode := range adv69bModes() {
		for _, c := range []struct{ method, path string }{
			{"GET", "/stray"}, {"HEAD", "/head"}, {"GET", "/204"}, {"GET", "/big"},
		} {
			t.Run(mode.name+c.path, func(t *testing.T) {
				release := make(chan struct{})
				defer close(release)
				up, tc := newAdv69bUpstream(t, mode.useTLS, adv69bAnswer(release))
				m := newMember(t, adv69bSpec, func(tr *Transport) { tr.TLSClientConfig = tc })
				adv69bHold(t, m.tr, up.url, 2)

				_, first, err := adv69bDo(t, m.tr, "GET", up.url+"/conn", "")
				if err != nil || !strings.HasPrefix(first, "127.0.0.1:") {
					t.Fatalf("/conn with the table full: %q %v", first, err)
				}
				if m.node.spares.len() != 1 {
					t.Fatalf("%d spares after a reusable exchange outside the table; want 1", m.node.spares.len())
				}
				resp, body, err := adv69bDo(t, m.tr, c.method, up.url+c.path, "")
				if err != nil {
					t.Fatalf("%s %s: %v", c.method, c.path, err)
				}
				_ = resp
				time.Sleep(30 * time.Millisecond) // the stray bytes arrive
				_, next, err := adv69bDo(t, m.tr, "GET", up.url+"/conn", "")
				if err != nil || !strings.HasPrefix(next, "127.0.0.1:") {
					t.Fatalf("the request after %s %s (body %d bytes): %q %v; want its own answer", c.method, c.path, len(body), next, err)
				}
				if next == first {
					t.Fatalf("the request after %s %s went on the connection with stray bytes (%s)", c.method, c.path, first)
				}
				assertAdv69bOpen(t, m, 2)
			})
		}
	}
}

// assertAdv69bOpen checks that the node's dial admission count equals the
// connections it holds: held in the table plus its spares. It looks again
// for up to 500ms, as a sweep under way takes the spares out of the count
// of Stats for a moment (TestAdv69bOpenConnsDuringSweep).
func assertAdv69bOpen(t *testing.T, m *member, held int) {
	t.Helper()
	var o int64
	var sp, oc int
	for end := time.Now().Add(500 * time.Millisecond); ; time.Sleep(time.Millisecond) {
		sp = m.node.spares.len()
		o = m.node.open.Load()
		oc = m.node.Stats().OpenConns
		if int(o) == held+sp && oc == held+sp || time.Now().After(end) {
			break
		}
	}
	if int(o) != held+sp {
		t.Fatalf("n.open = %d; want %d held + %d spares", o, held, sp)
	}
	if oc != held+sp {
		t.Fatalf("OpenConns = %d; want %d held + %d spares", oc, held, sp)
	}
}

// TestAdv69bSpareClosedByUpstream: a spare the upstream closed while it sat
// idle is not used: a POST (not replayable) that comes next goes on a new
// connection and is served.
func TestAdv69bSpareClosedByUpstream(t *testing.T) {
	for _, mode := range adv69bModes() {
		t.Run(mode.name, func(t *testing.T) {
			release := make(chan struct{})
			defer close(release)
			up, tc := newAdv69bUpstream(t, mode.useTLS, adv69bAnswer(release))
			m := newMemberOpts(t, adv69bSpec, NodeOptions{SweepInterval: time.Hour}, func(tr *Transport) { tr.TLSClientConfig = tc })
			adv69bHold(t, m.tr, up.url, 2)
			if _, body, err := adv69bDo(t, m.tr, "GET", up.url+"/drop", ""); err != nil || body != "ok" {
				t.Fatalf("/drop: %q %v", body, err)
			}
			time.Sleep(50 * time.Millisecond) // the close arrives
			if _, body, err := adv69bDo(t, m.tr, "POST", up.url+"/conn", "payload"); err != nil || !strings.HasPrefix(body, "127.0.0.1:") {
				t.Fatalf("a POST after the spare's upstream closed it: %q %v", body, err)
			}
			assertAdv69bOpen(t, m, 2)
		})
	}
}

// TestAdv69bSpareClosedAtNextRequest: the upstream closes a spare the moment
// the next request arrives on it, unanswered (as one racing its idle timeout
// does). A GET, and a PUT with an Idempotency-Key whose body can be had again, are sent again on a
// new connection, with the whole body; a POST is not (as net/http), and
// fails rather than hang. Nothing leaks from the count.
func TestAdv69bSpareClosedAtNextRequest(t *testing.T) {
	for _, mode := range adv69bModes() {
		t.Run(mode.name, func(t *testing.T) {
			release := make(chan struct{})
			defer close(release)
			var bodies, armed sync.Map
			var got atomic.Int32
			ans := adv69bAnswer(release)
			up, tc := newAdv69bUpstream(t, mode.useTLS, func(c netConn, br bufioReader, req *http.Request) bool {
				if req.URL.Path == "/dropnext" {
					armed.Store(c, true)
				}
				if req.URL.Path == "/echo" {
					if _, ok := armed.Load(c); ok {
						c.Close() // at the head, body unread
						return false
					}
					b, _ := io.ReadAll(req.Body)
					bodies.Store(got.Add(1), string(b))
					io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: "+strconv.Itoa(len(b))+"\r\n\r\n"+string(b))
					return true
				}
				return ans(c, br, req)
			})
			m := newMemberOpts(t, adv69bSpec, NodeOptions{SweepInterval: time.Hour}, func(tr *Transport) { tr.TLSClientConfig = tc })
			adv69bHold(t, m.tr, up.url, 2)

			// GET: first answered, then dropped at the next request.
			for i := range 2 {
				_, body, err := adv69bDo(t, m.tr, "GET", up.url+"/dropnext", "")
				if err != nil || body != "ok" {
					t.Fatalf("GET %d on a spare dropped at its next request: %q %v", i, body, err)
				}
			}
			// PUT with GetBody on a spare that the upstream drops at it.
			payload := strings.Repeat("x", 100<<10)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			// Make a spare that drops its next request: answer one /dropnext
			// on a fresh connection.
			m.tr.CloseIdleConnections()
			if _, _, err := adv69bDo(t, m.tr, "GET", up.url+"/dropnext", ""); err != nil {
				t.Fatal(err)
			}
			req, _ := http.NewRequestWithContext(ctx, "PUT", up.url+"/echo", bytes.NewReader([]byte(payload)))
			req.Header.Set("Idempotency-Key", "k1")
			resp, err := m.tr.RoundTrip(req)
			if err != nil {
				t.Fatalf("a PUT with GetBody on a spare dropped at its head: %v; want it sent again", err)
			}
			b, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil || string(b) != payload {
				t.Fatalf("the PUT sent again: %d bytes back, %v; want the whole body", len(b), err)
			}
			assertAdv69bOpen(t, m, 2)
		})
	}
}

// TestAdv69bSpareNotKeptAfterClose: Connection: close, a cancelled body and
// a 101 leave no spare; a 101 refused (200 to an upgrade) keeps the
// connection only as an ordinary exchange would.
func TestAdv69bSpareNotKeptAfterClose(t *testing.T) {
	for _, mode := range adv69bModes() {
		t.Run(mode.name, func(t *testing.T) {
			release := make(chan struct{})
			defer close(release)
			up, tc := newAdv69bUpstream(t, mode.useTLS, adv69bAnswer(release))
			m := newMemberOpts(t, adv69bSpec, NodeOptions{SweepInterval: time.Hour}, func(tr *Transport) { tr.TLSClientConfig = tc })
			adv69bHold(t, m.tr, up.url, 2)
			if _, body, err := adv69bDo(t, m.tr, "GET", up.url+"/close", ""); err != nil || body != "ok" {
				t.Fatalf("/close: %q %v", body, err)
			}
			if n := m.node.spares.len(); n != 0 {
				t.Fatalf("%d spares after Connection: close", n)
			}
			assertAdv69bOpen(t, m, 2)
			waitFor(t, 2*time.Second, "the Connection: close connection closed", func() bool { return up.open() == 2 })

			// A body cancelled mid-way.
			ctx, cancel := context.WithCancel(context.Background())
			req, _ := http.NewRequestWithContext(ctx, "GET", up.url+"/big", nil)
			resp, err := m.tr.RoundTrip(req)
			if err != nil {
				cancel()
				t.Fatal(err)
			}
			buf := make([]byte, 10)
			io.ReadFull(resp.Body, buf)
			cancel()
			resp.Body.Close()
			waitFor(t, 2*time.Second, "the cancelled exchange's connection closed", func() bool {
				return m.node.spares.len() == 0 && m.node.open.Load() == 2 && up.open() == 2
			})
			assertAdv69bOpen(t, m, 2)
		})
	}
}

// TestAdv69bSpareSettings: a spare honours MaxRequestsPerConn and
// IdleConnTimeout, at reuse and in the sweep.
func TestAdv69bSpareSettings(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	up, _ := newAdv69bUpstream(t, false, adv69bAnswer(release))
	m := newMemberOpts(t, adv69bSpec, NodeOptions{SweepInterval: 20 * time.Millisecond}, func(tr *Transport) {
		tr.MaxRequestsPerConn = 2
		tr.IdleConnTimeout = 150 * time.Millisecond
	})
	adv69bHold(t, m.tr, up.url, 2)
	var addrs []string
	for range 3 {
		_, a, err := adv69bDo(t, m.tr, "GET", up.url+"/conn", "")
		if err != nil {
			t.Fatal(err)
		}
		addrs = append(addrs, a)
	}
	if addrs[0] != addrs[1] || addrs[2] == addrs[1] {
		t.Fatalf("connections %v: want the first two on one, the third on another (MaxRequestsPerConn 2)", addrs)
	}
	waitFor(t, 2*time.Second, "the idle spare swept", func() bool { return m.node.spares.len() == 0 && m.node.open.Load() == 2 })
	assertAdv69bOpen(t, m, 2)
	waitFor(t, 2*time.Second, "the upstream to see the spares closed", func() bool { return up.open() == 2 })
}

// TestAdv69bSpareBound: concurrent requests outside the table leave at most
// len(slots) spares, the rest closed and counted out.
func TestAdv69bSpareBound(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	gate := make(chan struct{})
	var arrived atomic.Int32
	ans := adv69bAnswer(release)
	up, _ := newAdv69bUpstream(t, false, func(c netConn, br bufioReader, req *http.Request) bool {
		if req.URL.Path == "/gate" {
			arrived.Add(1)
			<-gate
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
			return true
		}
		return ans(c, br, req)
	})
	spec := orbitpool.PoolSpec{Lanes: 1, Keys: 4, ResourcesPerLane: 3}
	m := newMemberOpts(t, spec, NodeOptions{SweepInterval: time.Hour}, nil)
	adv69bHold(t, m.tr, up.url, 3)
	const N = 8
	var wg sync.WaitGroup
	errs := make(chan error, N)
	for range N {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, body, err := adv69bDo(t, m.tr, "GET", up.url+"/gate", "")
			if err == nil && body != "ok" {
				err = errors.New("body " + body)
			}
			errs <- err
		}()
	}
	deadline := time.Now().Add(3 * time.Second)
	for arrived.Load() < N && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	close(gate)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := m.node.spares.len(); n != 3 {
		t.Fatalf("%d spares; want len(slots) = 3", n)
	}
	assertAdv69bOpen(t, m, 3)
	waitFor(t, 2*time.Second, "the upstream to see the extra connections closed", func() bool { return up.open() == 6 })
}
