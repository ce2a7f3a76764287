package proxy

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
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

// adv21ChanListener hands one generation of a restarting upstream the
// connections the one real listener accepts.
type adv21ChanListener struct {
	ch   chan net.Conn
	done chan struct{}
	once sync.Once
	addr net.Addr
}

func (l *adv21ChanListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *adv21ChanListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *adv21ChanListener) Addr() net.Addr { return l.addr }

// adv21Restarting is an HTTP/2 upstream (net/http's server; h2c, or h2 and
// http/1.1 by ALPN over TLS) that restarts every period (never, for 0): the
// current generation's Shutdown sends GOAWAY on each of its connections and
// closes them once their streams end (or after grace, by force), while a
// new generation takes the connections accepted from then on. The
// listening socket never closes, as with a server handing its socket to its
// successor.
type adv21Restarting struct {
	url      string
	roots    *x509.CertPool // of the TLS upstream's certificate
	ln       net.Listener
	cur      atomic.Pointer[adv21ChanListener]
	restarts atomic.Int64
	conns    atomic.Int64
	// forced counts generations closed by force, their grace over: a
	// client kept a connection open past its GOAWAY. Run one side at a
	// time, twelve runs each, stock's callers left two such connections
	// and orbit's none.
	forced atomic.Int64
	stop   chan struct{}
	wg     sync.WaitGroup
}

func newAdv21Restarting(t testing.TB, handler http.HandlerFunc, period, grace time.Duration) *adv21Restarting {
	return newRestartingUpstream(t, handler, period, grace, 100, false)
}

func newRestartingUpstream(t testing.TB, handler http.HandlerFunc, period, grace time.Duration, maxStreams int, useTLS bool) *adv21Restarting {
	t.Helper()
	var tlsCfg *tls.Config
	u := &adv21Restarting{stop: make(chan struct{})}
	if useTLS {
		certSrc := httptest.NewUnstartedServer(http.NotFoundHandler())
		certSrc.StartTLS()
		tlsCfg = certSrc.TLS.Clone()
		tlsCfg.NextProtos = nil
		u.roots = x509.NewCertPool()
		u.roots.AddCert(certSrc.Certificate())
		certSrc.Close()
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u.ln = ln
	u.url = "http://" + ln.Addr().String()
	if useTLS {
		u.url = "https://" + ln.Addr().String()
	}
	start := func() *http.Server {
		l := &adv21ChanListener{ch: make(chan net.Conn), done: make(chan struct{}), addr: ln.Addr()}
		var p http.Protocols
		s := &http.Server{Handler: handler, Protocols: &p, HTTP2: &http.HTTP2Config{MaxConcurrentStreams: maxStreams}}
		if useTLS {
			p.SetHTTP1(true)
			p.SetHTTP2(true)
			s.TLSConfig = tlsCfg.Clone()
		} else {
			p.SetUnencryptedHTTP2(true)
		}
		u.cur.Store(l)
		u.wg.Add(1)
		go func() {
			defer u.wg.Done()
			if useTLS {
				s.ServeTLS(l, "", "")
			} else {
				s.Serve(l)
			}
		}()
		return s
	}
	srv := start()
	// Dispatcher: each accepted connection goes to the current generation.
	u.wg.Add(1)
	go func() {
		defer u.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u.conns.Add(1)
			for {
				l := u.cur.Load()
				select {
				case l.ch <- c:
				case <-l.done:
					continue
				case <-u.stop:
					c.Close()
				}
				break
			}
		}
	}()
	u.wg.Add(1)
	go func() {
		defer u.wg.Done()
		var tk <-chan time.Time
		if period > 0 {
			t := time.NewTicker(period)
			defer t.Stop()
			tk = t.C
		}
		for {
			select {
			case <-u.stop:
				srv.Close()
				return
			case <-tk:
			}
			old := srv
			srv = start()
			u.restarts.Add(1)
			u.wg.Add(1)
			go func() {
				defer u.wg.Done()
				// Shutdown sends GOAWAY to the connections serving HTTP/2
				// when it runs. One the old generation accepted just before,
				// whose handshake ends after, would get none and be cut with
				// its streams once grace ends: a fault no client can retry,
				// which fails whichever client's streams it carries. Shutdown
				// again every 10ms reaches those too.
				end := time.Now().Add(grace)
				for {
					ctx, cancel := context.WithTimeout(context.Background(), min(time.Until(end), 10*time.Millisecond))
					err := old.Shutdown(ctx)
					cancel()
					if err == nil {
						return
					}
					if !time.Now().Before(end) {
						u.forced.Add(1)
						old.Close()
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() {
		close(u.stop)
		ln.Close()
		u.wg.Wait()
	})
	return u
}

// TestAdv21H2RestartChurnNoWorseThanStock: an h2c upstream restarts (GOAWAY,
// then close once its streams end) every 40ms while 12 callers through
// orbit and 12 through stock net/http (an http.Transport speaking h2c) send
// short requests for 2s. Every request is a GET without a body, which the
// upstream answers in about 2ms: any failure is one the client could have
// avoided by sending the request again elsewhere. Orbit must not fail more
// often than stock.
func TestAdv21H2RestartChurnNoWorseThanStock(t *testing.T) {
	t.Run("local", func(t *testing.T) { testAdv21RestartChurn(t, false) })
	t.Run("sibling", func(t *testing.T) { testAdv21RestartChurn(t, true) })
}

// testAdv21RestartChurn runs the orbit callers on one member, or (sibling)
// half of them on a second member of the fleet, whose requests go through
// the first's connections: the fleet has room for two.
func testAdv21RestartChurn(t *testing.T, sibling bool) {
	up := newAdv21Restarting(t, func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(2 * time.Millisecond)
		io.WriteString(w, "ok")
	}, 40*time.Millisecond, 500*time.Millisecond)
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	testRestartChurn(t, up, func(tr *Transport) { tr.H2C = true }, &http.Transport{Protocols: &p}, sibling)
}

// testRestartChurn sends short GETs for 2s from 12 callers through orbit
// (one member, or two sharing the connections, the fleet's cap two) and 12
// through stock, an http.Transport for the same upstream, while up
// restarts. Orbit must not fail more often than stock, every stream's unit
// must come back, and every connection must leave the pool once the churn
// stops and the transports close idle ones.
func testRestartChurn(t *testing.T, up *adv21Restarting, conf func(*Transport), stock *http.Transport, sibling bool) {
	defer stock.CloseIdleConnections()
	opts := NodeOptions{SweepInterval: 50 * time.Millisecond}
	spec := testSpec
	spec.Path = filepath.Join(t.TempDir(), "seg")
	capped := func(tr *Transport) { conf(tr); tr.MaxConnsPerKey = 2 }
	m := newMemberOpts(t, spec, opts, capped)
	rts := []http.RoundTripper{m.tr, m.tr}
	var sib *member
	if sibling {
		sib = newMemberOpts(t, spec, opts, capped)
		rts[1] = sib.tr
	}
	orbit, std := &adv22Tally{fails: map[string]int{}}, &adv22Tally{fails: map[string]int{}}
	run := func(rt http.RoundTripper, tl *adv22Tally, deadline time.Time, wg *sync.WaitGroup) {
		defer wg.Done()
		for time.Now().Before(deadline) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			tl.add(adv21Get(rt, ctx, up.url+"/"))
			cancel()
		}
	}
	var wg sync.WaitGroup
	deadline := time.Now().Add(2 * time.Second)
	for i := range 12 {
		wg.Add(2)
		go run(rts[i%2], orbit, deadline, &wg)
		go run(stock, std, deadline, &wg)
	}
	wg.Wait()
	t.Logf("h2Wrapped=%v restarts=%d (%d forced) upstream conns=%d; orbit: %d requests, %d failed; stock: %d requests, %d failed",
		h2Wrapped, up.restarts.Load(), up.forced.Load(), up.conns.Load(), orbit.reqs, orbit.failed(), std.reqs, std.failed())
	orbit.show(t, "orbit")
	std.show(t, "stock")
	if orbit.failed() > std.failed() {
		t.Errorf("orbit failed %d requests, stock net/http %d, against the same restarting upstream", orbit.failed(), std.failed())
	}
	if sibling && m.node.Stats().ServedRemote+sib.node.Stats().ServedRemote == 0 {
		t.Error("no request went through a sibling's connection: the test shows nothing of that path")
	}
	key := mustKey(t, m.tr, up.url)
	waitFor(t, 5*time.Second, "every stream's unit to come back", func() bool {
		c, _ := m.pool.Candidates(key, nil)
		for _, r := range c {
			if r.InUse != 0 || r.Pending != 0 {
				return false
			}
		}
		return true
	})
	ms := []*member{m}
	if sib != nil {
		ms = append(ms, sib)
	}
	closeIdleUntilGone(t, key, 5*time.Second, ms...)
}

func adv21Get(rt http.RoundTripper, ctx context.Context, url string) error {
	req, err := http.NewRequestWithContext(ctx, "GET", url, nil)
	if err != nil {
		return err
	}
	resp, err := rt.RoundTrip(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != 200 || string(b) != "ok" || resp.ProtoMajor != 2 {
		return errors.New(resp.Proto + " " + resp.Status + " " + string(b))
	}
	return nil
}
