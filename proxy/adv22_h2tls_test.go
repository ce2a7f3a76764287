package proxy

import (
	"crypto/tls"
	"io"
	"net/http"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
)

// adv22TLSRestarting is adv21Restarting over TLS: each generation offers h2
// and http/1.1 by ALPN.
type adv22TLSRestarting = adv21Restarting

func newAdv22TLSRestarting(t testing.TB, handler http.HandlerFunc, period, grace time.Duration, maxStreams int) *adv22TLSRestarting {
	return newRestartingUpstream(t, handler, period, grace, maxStreams, true)
}

func (u *adv22TLSRestarting) conf(tr *Transport) {
	tr.HTTP2 = true
	tr.TLSClientConfig = &tls.Config{RootCAs: u.roots}
}

// stock is net/http's Transport speaking HTTP/2 over TLS (ALPN h2).
func (u *adv22TLSRestarting) stock() *http.Transport {
	return &http.Transport{TLSClientConfig: &tls.Config{RootCAs: u.roots}, ForceAttemptHTTP2: true}
}

type adv22Tally struct {
	mu    sync.Mutex
	reqs  int
	fails map[string]int
}

func (tl *adv22Tally) add(err error) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	tl.reqs++
	if err != nil {
		msg := err.Error()
		if i := strings.Index(msg, "127.0.0.1:"); i >= 0 {
			msg = msg[:i]
		}
		tl.fails[msg]++
	}
}

func (tl *adv22Tally) failed() (n int) {
	for _, v := range tl.fails {
		n += v
	}
	return n
}

func (tl *adv22Tally) show(t *testing.T, who string) {
	var ks []string
	for k := range tl.fails {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	for _, k := range ks {
		t.Logf("  %s: %dx %s", who, tl.fails[k], k)
	}
}

// TestAdv22H2TLSRestartChurnNoWorseThanStock: TestAdv21H2RestartChurn over
// TLS, h2 chosen by ALPN: the upstream restarts (GOAWAY, close once idle)
// every 40ms while 12 callers through orbit (one member, or two sharing
// connections) and 12 through stock net/http over TLS send short GETs for
// 2s. Orbit must not fail more often than stock, and every connection must
// leave the pool once the churn stops and the transports close idle ones.
func TestAdv22H2TLSRestartChurnNoWorseThanStock(t *testing.T) {
	t.Run("local", func(t *testing.T) { testAdv22TLSChurn(t, false) })
	t.Run("sibling", func(t *testing.T) { testAdv22TLSChurn(t, true) })
}

func testAdv22TLSChurn(t *testing.T, sibling bool) {
	up := newAdv22TLSRestarting(t, func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(2 * time.Millisecond)
		io.WriteString(w, "ok")
	}, 40*time.Millisecond, 500*time.Millisecond, 100)
	testRestartChurn(t, up, up.conf, up.stock(), sibling)
}
