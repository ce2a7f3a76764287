package proxy

import (
	"context"
	"io"
	"net/http"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// TestAdv22H2CloseIdleUnderLoad: callers on two members (one through the
// other's connections) send short GETs over HTTP/2 (h2c, and TLS by ALPN)
// while each Transport's CloseIdleConnections runs every millisecond; stock
// net/http does the same against the same upstream. Orbit must fail no more
// requests than stock, and once the load stops one more
// CloseIdleConnections leaves nothing live.
func TestAdv22H2CloseIdleUnderLoad(t *testing.T) {
	for _, useTLS := range []bool{false, true} {
		name := "h2c"
		if useTLS {
			name = "tls"
		}
		t.Run(name, func(t *testing.T) {
			handler := func(w http.ResponseWriter, r *http.Request) {
				time.Sleep(time.Millisecond)
				io.WriteString(w, "ok")
			}
			var conf func(*Transport)
			var url string
			var stock *http.Transport
			if useTLS {
				up := newAdv22TLSRestarting(t, handler, 0, time.Second, 4)
				conf, url, stock = up.conf, up.url, up.stock()
			} else {
				up := newAdv21Restarting(t, handler, time.Hour, time.Second)
				conf, url = h2cConf, up.url
				var p http.Protocols
				p.SetUnencryptedHTTP2(true)
				stock = &http.Transport{Protocols: &p}
			}
			defer stock.CloseIdleConnections()
			spec := testSpec
			spec.Path = filepath.Join(t.TempDir(), "seg")
			opts := NodeOptions{SweepInterval: 50 * time.Millisecond}
			c := func(tr *Transport) { conf(tr); tr.MaxConnsPerKey = 3 }
			m := newMemberOpts(t, spec, opts, c)
			sib := newMemberOpts(t, spec, opts, c)
			orbit, std := &adv22Tally{fails: map[string]int{}}, &adv22Tally{fails: map[string]int{}}
			deadline := time.Now().Add(1500 * time.Millisecond)
			var wg sync.WaitGroup
			run := func(rt http.RoundTripper, tl *adv22Tally) {
				defer wg.Done()
				for time.Now().Before(deadline) {
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					tl.add(adv21Get(rt, ctx, url+"/"))
					cancel()
				}
			}
			closer := func(f func()) {
				defer wg.Done()
				for time.Now().Before(deadline) {
					f()
					time.Sleep(time.Millisecond)
				}
			}
			for i := range 6 {
				wg.Add(2)
				go run([]http.RoundTripper{m.tr, sib.tr}[i%2], orbit)
				go run(stock, std)
			}
			wg.Add(3)
			go closer(m.tr.CloseIdleConnections)
			go closer(sib.tr.CloseIdleConnections)
			go closer(stock.CloseIdleConnections)
			wg.Wait()
			t.Logf("h2Wrapped=%v orbit: %d requests, %d failed (created %d+%d, served remote %d); stock: %d requests, %d failed",
				h2Wrapped, orbit.reqs, orbit.failed(), m.node.Stats().Created, sib.node.Stats().Created,
				m.node.Stats().ServedRemote+sib.node.Stats().ServedRemote, std.reqs, std.failed())
			orbit.show(t, "orbit")
			std.show(t, "stock")
			if orbit.failed() > std.failed() {
				t.Errorf("orbit failed %d requests, stock %d", orbit.failed(), std.failed())
			}
			key := mustKey(t, m.tr, url)
			closeIdleUntilGone(t, key, 3*time.Second, m, sib)
		})
	}
}
