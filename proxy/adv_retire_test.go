package proxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	countingupstream "github.com/orbitproxy/orbit/integration/upstream"
	"github.com/orbitproxy/orbit/orbitpool"
)

// How a retire upstream answers our half-close (EOF on its read side, or a
// TLS close_notify).
const (
	onEOFClose  = "close"  // closes at once, as a Go server does
	onEOFSilent = "silent" // keeps its side open for a second
	onEOFFlood  = "flood"  // keeps sending bytes until the write fails
	onEOFRST    = "rst"    // resets the connection (SO_LINGER 0)
)

type retireUpstream struct {
	mode     string // what it does with our half-close: onEOFClose and the like
	url      string
	roots    *x509.CertPool
	accepted atomic.Int64
	open     atomic.Int64 // accepted and not yet closed by the upstream
	eofs     atomic.Int64 // half-closes seen
}

// startRetireUpstream answers every request with a two-byte body and reacts
// to our half-close as mode says. Every connection it holds is closed at
// cleanup.
func startRetireUpstream(t testing.TB, mode string, useTLS bool) *retireUpstream {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := &retireUpstream{mode: mode, url: "http://" + ln.Addr().String()}
	var cfg *tls.Config
	if useTLS {
		ts := httptest.NewTLSServer(http.NotFoundHandler())
		cfg = ts.TLS.Clone()
		cfg.NextProtos = []string{"http/1.1"}
		u.roots = x509.NewCertPool()
		u.roots.AddCert(ts.Certificate())
		ts.Close()
		u.url = "https://" + ln.Addr().String()
	}
	stop := make(chan struct{})
	serveConns(t, ln, func(raw net.Conn, _ int) {
		u.accepted.Add(1)
		u.open.Add(1)
		defer func() {
			raw.Close() // before the count drops: tests read it as closed
			u.open.Add(-1)
		}()
		c := raw
		if cfg != nil {
			c = tls.Server(raw, cfg)
		}
		br := bufio.NewReader(c)
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				if err != io.EOF {
					return
				}
				u.eofs.Add(1)
				switch mode {
				case onEOFSilent:
					select {
					case <-time.After(time.Second):
					case <-stop:
					}
				case onEOFFlood:
					buf := make([]byte, 16<<10)
					for i := range buf {
						buf[i] = 'x'
					}
					c.SetWriteDeadline(time.Now().Add(3 * time.Second))
					for {
						if _, err := c.Write(buf); err != nil {
							break
						}
					}
				case onEOFRST:
					raw.(*net.TCPConn).SetLinger(0)
				}
				return
			}
			io.Copy(io.Discard, req.Body)
			if req.URL.Path == "/slow" {
				time.Sleep(300 * time.Millisecond)
			}
			if _, err := io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"); err != nil {
				return
			}
		}
	})
	// Registered after serveConns's, so run before it: a silent handler
	// waits on stop.
	t.Cleanup(func() { close(stop) })
	return u
}

func (u *retireUpstream) conf(tr *Transport) {
	if u.roots != nil {
		tr.TLSClientConfig = &tls.Config{RootCAs: u.roots}
	}
}

func retireKey(t testing.TB, tr *Transport, url string) orbitpool.Key {
	t.Helper()
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, key, err := tr.Upstream(req)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

func getBody(ctx context.Context, rt http.RoundTripper, url string) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "GET", url, nil)
	if err != nil {
		return err
	}
	resp, err := rt.RoundTrip(req)
	if err != nil {
		return err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err == nil && resp.StatusCode != 200 {
		err = fmt.Errorf("status %d", resp.StatusCode)
	}
	return err
}

func openFDs(t testing.TB) int {
	es, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip("no /proc/self/fd")
	}
	return len(es)
}

// settle waits until f() <= want, and reports the last value.
func settle(d time.Duration, want int, f func() int) int {
	deadline := time.Now().Add(d)
	for {
		v := f()
		if v <= want || time.Now().After(deadline) {
			return v
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// forEachRetireUpstream runs f against each kind of upstream, plain and TLS.
func forEachRetireUpstream(t *testing.T, f func(t *testing.T, u *retireUpstream)) {
	for _, useTLS := range []bool{false, true} {
		for _, mode := range []string{onEOFClose, onEOFSilent, onEOFFlood, onEOFRST} {
			t.Run(fmt.Sprintf("tls=%v/%s", useTLS, mode), func(t *testing.T) { f(t, startRetireUpstream(t, mode, useTLS)) })
		}
	}
}

// TestAdvRetireBudgetBackWithinCloseWait: whatever the upstream does with
// our half-close (closes, stays silent, keeps sending, resets), plain or
// TLS, a connection retired by MaxRequestsPerConn gives its unit back
// within about closeWait, the caller is not held for it, and an upstream
// that closes at once gets it back well before closeWait.
func TestAdvRetireBudgetBackWithinCloseWait(t *testing.T) {
	forEachRetireUpstream(t, func(t *testing.T, u *retireUpstream) {
		m := newFleet(t, 1, func(tr *Transport) {
			u.conf(tr)
			tr.MaxConnsPerKey = 1
			tr.MaxRequestsPerConn = 1
		})[0]
		key := retireKey(t, m.tr, u.url+"/")
		const rounds = 6
		var releases []time.Duration
		for i := range rounds {
			start := time.Now()
			if err := getBody(context.Background(), m.tr, u.url+"/"); err != nil {
				t.Fatalf("request %d: %v", i, err)
			}
			if d := time.Since(start); d > closeWait*4/5 {
				t.Errorf("request %d took %v: the caller waited on the retirement", i, d)
			}
			done := time.Now()
			for m.pool.Live(key) != 0 {
				if time.Since(done) > 3*time.Second {
					t.Fatalf("round %d: the retired connection kept its unit for %v", i, time.Since(done))
				}
				time.Sleep(time.Millisecond)
			}
			releases = append(releases, time.Since(done))
		}
		sort.Slice(releases, func(i, j int) bool { return releases[i] < releases[j] })
		med, worst := releases[rounds/2], releases[rounds-1]
		if worst > closeWait+400*time.Millisecond {
			t.Errorf("unit came back after %v at worst (closeWait %v): %v", worst, closeWait, releases)
		}
		switch u.mode {
		case onEOFClose, onEOFRST:
			if med >= closeWait*3/4 {
				t.Errorf("the upstream closed at once, yet the unit came back after %v (median): %v", med, releases)
			}
		case onEOFSilent, onEOFFlood:
			if releases[0] < closeWait*4/5 {
				t.Errorf("the upstream kept its side open, yet the unit came back after %v: %v", releases[0], releases)
			}
		}
		if got := u.eofs.Load(); got < rounds-1 {
			t.Errorf("the upstream saw %d half-closes for %d retirements", got, rounds)
		}
	})
}

// TestAdvRetireNoLeaks: many retirements, several at once, against each
// kind of upstream: afterwards goroutines and descriptors go back to where
// they were, and every unit of the budget is back.
func TestAdvRetireNoLeaks(t *testing.T) {
	forEachRetireUpstream(t, func(t *testing.T, u *retireUpstream) {
		ms := newFleet(t, 2, func(tr *Transport) {
			u.conf(tr)
			tr.MaxConnsPerKey = 6
			tr.MaxRequestsPerConn = 1
		})
		key := retireKey(t, ms[0].tr, u.url+"/")
		// One round first, so that lazily started goroutines exist.
		if err := getBody(context.Background(), ms[0].tr, u.url+"/"); err != nil {
			t.Fatal(err)
		}
		settle(3*time.Second, 0, func() int { return ms[0].pool.Live(key) })
		settle(3*time.Second, 0, func() int { return int(u.open.Load()) })
		time.Sleep(50 * time.Millisecond)
		g0, f0 := runtime.NumGoroutine(), openFDs(t)

		per := 10
		if u.mode == onEOFSilent || u.mode == onEOFFlood {
			per = 5 // each retirement holds its unit for closeWait
		}
		var wg sync.WaitGroup
		var errs atomic.Int64
		for i := range 8 {
			m := ms[i%2]
			wg.Go(func() {
				for range per {
					if err := getBody(context.Background(), m.tr, u.url+"/"); err != nil {
						errs.Add(1)
						t.Log(err)
					}
				}
			})
		}
		wg.Wait()
		if errs.Load() != 0 {
			t.Errorf("%d requests failed", errs.Load())
		}
		if live := settle(2*time.Second, 0, func() int { return ms[0].pool.Live(key) }); live != 0 {
			t.Errorf("%d units still held 2s after the last request", live)
		}
		settle(3*time.Second, 0, func() int { return int(u.open.Load()) })
		if g := settle(3*time.Second, g0+2, runtime.NumGoroutine); g > g0+2 {
			buf := make([]byte, 1<<20)
			t.Errorf("goroutines: %d before, %d after\n%s", g0, g, buf[:runtime.Stack(buf, true)])
		}
		if f := settle(3*time.Second, f0+1, func() int { return openFDs(t) }); f > f0+1 {
			t.Errorf("descriptors: %d before, %d after", f0, f)
		}
	})
}

// closeRace runs load on ms[0] with retirements that each take closeWait
// (a silent upstream), ends ms[0]'s node with end while they are in flight,
// and checks that end returns in bounded time, the load ends, and the
// sibling sees every unit back.
func closeRace(t *testing.T, end func(*Node) error) {
	u := startRetireUpstream(t, onEOFSilent, false)
	ms := newFleet(t, 2, func(tr *Transport) {
		tr.MaxConnsPerKey = 16
		tr.MaxRequestsPerConn = 1
	})
	key := retireKey(t, ms[0].tr, u.url+"/")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	var ok atomic.Int64
	for range 12 {
		wg.Go(func() {
			for ctx.Err() == nil {
				if getBody(ctx, ms[0].tr, u.url+"/") == nil {
					ok.Add(1)
				}
			}
		})
	}
	waitFor(t, 5*time.Second, "retirements in flight", func() bool { return ok.Load() >= 12 && ms[0].pool.Live(key) > 0 })
	start := time.Now()
	errc := make(chan error, 2)
	go func() { errc <- end(ms[0].node) }()
	go func() { errc <- ms[0].node.Close() }() // a second, concurrent Close
	for range 2 {
		select {
		case err := <-errc:
			if err != nil {
				t.Errorf("close: %v", err)
			}
		case <-time.After(5 * time.Second):
			buf := make([]byte, 1<<20)
			t.Fatalf("the node did not close within 5s\n%s", buf[:runtime.Stack(buf, true)])
		}
	}
	if d := time.Since(start); d > closeWait+time.Second {
		t.Errorf("closing took %v with retirements of at most %v in flight", d, closeWait)
	}
	cancel()
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-time.After(5 * time.Second):
		t.Fatal("requests still running 5s after the node closed")
	}
	// Requests that began after Close may still have registered and retired
	// connections; with MaxRequestsPerConn 1 none stays.
	if live := settle(2*time.Second, 0, func() int { return ms[1].pool.Live(key) }); live != 0 {
		t.Errorf("the sibling sees %d units held after the node closed", live)
	}
	if n := ms[0].node.Stats().OpenConns; n != 0 {
		t.Errorf("%d connections still owned by the closed node", n)
	}
}

func TestAdvRetireCloseRacesRetirements(t *testing.T) {
	for range 3 {
		closeRace(t, (*Node).Close)
	}
}

func TestAdvRetireShutdownRacesRetirements(t *testing.T) {
	for range 3 {
		closeRace(t, func(n *Node) error {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			return n.Shutdown(ctx)
		})
	}
}

// TestAdvRetireSiblingWaiterNotHandedRetiring: one connection for the
// fleet, retired after every request, with a silent upstream so that each
// retirement takes closeWait. Both members send requests at once: a waiter
// (in either) must never get a lease on the connection being retired (the
// owner would refuse it, the sender retry), and each waiter gets the unit
// within closeWait plus a margin per request ahead of it.
func TestAdvRetireSiblingWaiterNotHandedRetiring(t *testing.T) {
	u := startRetireUpstream(t, onEOFSilent, false)
	ms := newFleet(t, 2, func(tr *Transport) {
		tr.MaxConnsPerKey = 1
		tr.MaxRequestsPerConn = 1
	})
	const per, goroutines = 4, 4
	var wg sync.WaitGroup
	var errs atomic.Int64
	var worst atomic.Int64
	for i := range goroutines {
		m := ms[i%2]
		wg.Go(func() {
			for range per {
				start := time.Now()
				if err := getBody(context.Background(), m.tr, u.url+"/"); err != nil {
					errs.Add(1)
					t.Log(err)
				}
				d := int64(time.Since(start))
				for w := worst.Load(); d > w && !worst.CompareAndSwap(w, d); w = worst.Load() {
				}
			}
		})
	}
	wg.Wait()
	if errs.Load() != 0 {
		t.Errorf("%d requests failed", errs.Load())
	}
	for i, m := range ms {
		st := m.node.Stats()
		if st.Refused != 0 || st.Retries != 0 {
			t.Errorf("member %d: %d leases refused %v, %d retries: a waiter was handed a retiring connection", i, st.Refused, st.RefusedBy, st.Retries)
		}
	}
	// At most goroutines-1 requests ahead of any one, each ~closeWait.
	if w := time.Duration(worst.Load()); w > goroutines*(closeWait+250*time.Millisecond) {
		t.Errorf("a request waited %v for the one connection", w)
	}
	if got := u.accepted.Load(); got != per*goroutines {
		t.Errorf("the upstream accepted %d connections for %d requests, one each", got, per*goroutines)
	}
}

// TestAdvRetireCapsUnderChurn: a counting upstream whose own cap equals the
// fleet's, three members, request limits 1 and 2 and a short lifetime: no
// client error, no refused connection, never more open than the cap.
func TestAdvRetireCapsUnderChurn(t *testing.T) {
	cases := []struct {
		name     string
		reqs     int
		lifetime time.Duration
		tls      bool
	}{
		{"reqs=1", 1, 0, false},
		{"reqs=2", 2, 0, false},
		{"reqs=1/tls", 1, 0, true},
		{"reqs=2/tls", 2, 0, true},
		{"lifetime", 0, 20 * time.Millisecond, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			const limit = 3
			up := startCappedUpstream(t, countingupstream.Options{MaxConns: limit, TLS: tc.tls})
			ms := newFleet(t, 3, func(tr *Transport) {
				tr.MaxConnsPerKey = limit
				tr.MaxRequestsPerConn = tc.reqs
				tr.MaxConnLifetime = tc.lifetime
				if tc.tls {
					tr.TLSClientConfig = &tls.Config{RootCAs: up.CertPool}
				}
			})
			key := retireKey(t, ms[0].tr, up.URL+"/")
			stopMon := make(chan struct{})
			var over atomic.Int64
			monDone := make(chan struct{})
			go func() {
				defer close(monDone)
				for {
					select {
					case <-stopMon:
						return
					default:
					}
					if l := ms[1].pool.Live(key); l > limit {
						over.Store(int64(l))
					}
					time.Sleep(200 * time.Microsecond)
				}
			}()
			var wg sync.WaitGroup
			var errs atomic.Int64
			for i := range 6 {
				m := ms[i%3]
				wg.Go(func() {
					for range 15 {
						if err := getBody(context.Background(), m.tr, up.URL+"/"); err != nil {
							errs.Add(1)
							t.Log(err)
						}
					}
				})
			}
			wg.Wait()
			close(stopMon)
			<-monDone
			st := up.Stats()
			if errs.Load() != 0 || st.Refused != 0 || st.Peak > limit || over.Load() != 0 {
				t.Errorf("%d client errors; upstream refused %d, peak %d (cap %d); fleet live peak over cap: %d",
					errs.Load(), st.Refused, st.Peak, limit, over.Load())
			}
		})
	}
}

// TestAdvRetireLifetimeExpiredIdle: a connection whose lifetime ends while
// it sits idle leaves the pool the same way as one whose exchange ends past
// it: the next request, finding it expired, must not dial a replacement
// that the upstream (cap = the fleet's) still counts the old one against.
// The sweep is slow, so the request itself finds the expired connection.
func TestAdvRetireLifetimeExpiredIdle(t *testing.T) {
	const limit = 1
	up := startCappedUpstream(t, countingupstream.Options{MaxConns: limit})
	spec := testSpec
	spec.Path = t.TempDir() + "/seg"
	conf := func(tr *Transport) {
		tr.MaxConnsPerKey = limit
		tr.MaxConnLifetime = 15 * time.Millisecond
	}
	m := newMemberOpts(t, spec, NodeOptions{SweepInterval: time.Hour}, conf)
	var errs int
	for i := range 40 {
		if err := getBody(context.Background(), m.tr, up.URL+"/"); err != nil {
			errs++
			t.Logf("request %d: %v", i, err)
		}
		time.Sleep(20 * time.Millisecond) // idle past the lifetime
	}
	st := up.Stats()
	if errs != 0 || st.Refused != 0 {
		t.Errorf("%d client errors, %d connections refused by the upstream (its cap %d = the fleet's): an idle connection past its lifetime left the budget before the upstream saw it close",
			errs, st.Refused, limit)
	}
}

// TestAdvRetireShutdownIdleWithSiblingWaiting: a member leaving (Shutdown)
// with idle connections while a sibling needs them: the sibling must not
// dial replacements the upstream (cap = the fleet's) still counts the old
// ones against, and a lease the leaving member refuses, asked or not (see
// server.close), is sent elsewhere: no request fails.
func TestAdvRetireShutdownIdleWithSiblingWaiting(t *testing.T) {
	const limit = 2
	up := startCappedUpstream(t, countingupstream.Options{MaxConns: limit})
	spec := testSpec
	spec.Path = t.TempDir() + "/seg"
	conf := func(tr *Transport) { tr.MaxConnsPerKey = limit }
	b := newMember(t, spec, conf)
	var errs atomic.Int64
	for round := range 15 {
		a := newMember(t, spec, conf)
		// a makes both connections, then they go idle.
		var wg sync.WaitGroup
		up.SetDelay(20 * time.Millisecond)
		for range limit {
			wg.Go(func() {
				if err := getBody(context.Background(), a.tr, up.URL+"/"); err != nil {
					errs.Add(1)
					t.Log(err)
				}
			})
		}
		wg.Wait()
		up.SetDelay(0)
		for range limit {
			wg.Go(func() {
				if err := getBody(context.Background(), b.tr, up.URL+"/"); err != nil {
					errs.Add(1)
					t.Logf("round %d: %v", round, err)
				}
			})
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		a.node.Shutdown(ctx)
		cancel()
		wg.Wait()
		a.pool.Close() // its lane, for the next round's member
		// b's own connections go too, so the next round starts empty.
		b.tr.CloseIdleConnections()
		settle(2*time.Second, 0, func() int { return int(up.Stats().Open) })
	}
	st := up.Stats()
	if errs.Load() != 0 || st.Refused != 0 {
		t.Errorf("%d client errors, %d connections refused by the upstream (its cap %d = the fleet's) while a sibling drained",
			errs.Load(), st.Refused, limit)
	}
}

// TestAdvRetireLoweredCapKeepsTheCap: four connections busy, a reload
// lowers the cap to two, the four exchanges end together: two connections
// (the excess) leave and two stay. Connections still closing must not count
// as live when deciding whether another is over the cap.
func TestAdvRetireLoweredCapKeepsTheCap(t *testing.T) {
	for _, mode := range []string{onEOFClose, onEOFSilent} {
		t.Run(mode, func(t *testing.T) {
			u := startRetireUpstream(t, mode, false)
			m := newFleet(t, 1, func(tr *Transport) { tr.MaxConnsPerKey = 4 })[0]
			key := retireKey(t, m.tr, u.url+"/")
			var wg sync.WaitGroup
			for range 4 {
				wg.Go(func() {
					if err := getBody(context.Background(), m.tr, u.url+"/slow"); err != nil {
						t.Error(err)
					}
				})
			}
			waitFor(t, 3*time.Second, "four connections", func() bool { return m.pool.Live(key) == 4 })
			// The reload: a Transport with the lower cap records it as it
			// starts a request (which waits for a unit).
			lowered := &Transport{Node: m.node, MaxConnsPerKey: 2}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			go getBody(ctx, lowered, u.url+"/")
			wg.Wait()
			time.Sleep(closeWait + 300*time.Millisecond)
			if live := m.pool.Live(key); live != 2 {
				t.Errorf("%d connections left after the cap was lowered from 4 to 2 and the exchanges ended (want 2); retired %d",
					live, m.node.Stats().Retired)
			}
		})
	}
}
