package proxy

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// TestAdv22H2IdleAndLifetimeUnderLoad: HTTP/2 connections (h2c and TLS by
// ALPN) with a short IdleConnTimeout or MaxConnLifetime and a fast sweep,
// while callers on two members (one through the other's connections) send
// requests spaced around the idle timeout, so streams start as it fires,
// and some that take longer than the lifetime. Stock net/http with the same
// idle timeout serves the same load. No orbit request may fail where stock
// has none fail, and once the load stops every connection leaves the pool
// on its own (pool.Live back to 0) within a few timeouts.
func TestAdv22H2IdleAndLifetimeUnderLoad(t *testing.T) {
	for _, tc := range []struct {
		name     string
		tls      bool
		idle     time.Duration
		lifetime time.Duration
	}{
		{"h2c/idle", false, 60 * time.Millisecond, 0},
		{"tls/idle", true, 60 * time.Millisecond, 0},
		{"h2c/lifetime", false, 300 * time.Millisecond, 80 * time.Millisecond},
		{"tls/lifetime", true, 300 * time.Millisecond, 80 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			handler := func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == "/slow" {
					time.Sleep(100 * time.Millisecond)
				}
				io.WriteString(w, "ok")
			}
			var conf func(*Transport)
			var url string
			var stock http.RoundTripper
			if tc.tls {
				up := newAdv22TLSRestarting(t, handler, 0, time.Second, 100)
				conf, url = up.conf, up.url
				st := up.stock()
				st.IdleConnTimeout = tc.idle
				defer st.CloseIdleConnections()
				stock = st
			} else {
				up := newAdv21Restarting(t, handler, time.Hour, time.Second)
				conf = h2cConf
				url = up.url
				var p http.Protocols
				p.SetUnencryptedHTTP2(true)
				st := &http.Transport{Protocols: &p, IdleConnTimeout: tc.idle}
				defer st.CloseIdleConnections()
				stock = st
			}
			spec := testSpec
			spec.Path = filepath.Join(t.TempDir(), "seg")
			opts := NodeOptions{SweepInterval: 10 * time.Millisecond}
			c := func(tr *Transport) {
				conf(tr)
				tr.MaxConnsPerKey = 2
				tr.IdleConnTimeout = tc.idle
				tr.MaxConnLifetime = tc.lifetime
			}
			m := newMemberOpts(t, spec, opts, c)
			sib := newMemberOpts(t, spec, opts, c)
			orbit, std := &adv22Tally{fails: map[string]int{}}, &adv22Tally{fails: map[string]int{}}
			run := func(rt http.RoundTripper, tl *adv22Tally, seed uint64, deadline time.Time, wg *sync.WaitGroup) {
				defer wg.Done()
				rnd := rand.New(rand.NewPCG(seed, 1))
				for time.Now().Before(deadline) {
					path := "/"
					if rnd.IntN(4) == 0 {
						path = "/slow"
					}
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					tl.add(adv21Get(rt, ctx, url+path))
					cancel()
					// Around the idle timeout: 0.8x to 1.2x.
					time.Sleep(tc.idle*8/10 + time.Duration(rnd.Int64N(int64(tc.idle*4/10))))
				}
			}
			var wg sync.WaitGroup
			deadline := time.Now().Add(1500 * time.Millisecond)
			callers := 6
			if tc.lifetime == 0 {
				callers = 1 // the connection must go idle between requests
			}
			for i := range callers {
				wg.Add(3)
				go run(m.tr, orbit, uint64(i), deadline, &wg)
				go run(sib.tr, orbit, uint64(i+100), deadline, &wg)
				go run(stock, std, uint64(i+200), deadline, &wg)
			}
			wg.Wait()
			t.Logf("h2Wrapped=%v orbit: %d requests, %d failed (created %d+%d, retired %d+%d, served remote %d); stock: %d requests, %d failed",
				h2Wrapped, orbit.reqs, orbit.failed(), m.node.Stats().Created, sib.node.Stats().Created,
				m.node.Stats().Retired, sib.node.Stats().Retired, m.node.Stats().ServedRemote+sib.node.Stats().ServedRemote, std.reqs, std.failed())
			orbit.show(t, "orbit")
			std.show(t, "stock")
			if orbit.failed() > std.failed() {
				t.Errorf("orbit failed %d requests, stock %d", orbit.failed(), std.failed())
			}
			key := mustKey(t, m.tr, url)
			wait := 3*tc.idle + 500*time.Millisecond
			dl := time.Now().Add(wait)
			for m.pool.Live(key) != 0 && time.Now().Before(dl) {
				time.Sleep(5 * time.Millisecond)
			}
			if n := m.pool.Live(key); n != 0 {
				cs, _ := m.pool.Candidates(key, nil)
				t.Errorf("%d connections live %v after the load stopped (idle timeout %v): %s", n, wait, tc.idle, fmt.Sprint(cs))
			}
		})
	}
}
