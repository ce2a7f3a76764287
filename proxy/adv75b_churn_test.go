package proxy

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/orbitpool"
)

// TestAdv75bChurnMatrix: twenty reloads 30 ms apart under mixed GET/POST
// load from two stable members, for HTTP/1.1 and h2c upstreams, a key cap
// of 1 (requests queue for the one connection) and of 3, and old members
// that leave by Shutdown with time to spare ("spare") or with a 20 ms drain
// against a 30 ms upstream ("short"). Property: with time to spare nothing
// fails; with a short drain only requests that reached the upstream may
// fail; in every case no wrong answer, no POST twice, no caller past its
// deadline, and a quiet table after all close.
func TestAdv75bChurnMatrix(t *testing.T) {
	for _, proto := range []string{"h1", "h2c"} {
		for _, cap := range []int{1, 3} {
			for _, drain := range []string{"spare", "short"} {
				t.Run(fmt.Sprintf("%s/cap%d/%s", proto, cap, drain), func(t *testing.T) {
					adv75bChurn(t, proto, cap, drain == "short", testSpec.Lanes)
				})
			}
		}
	}
}

// TestAdv75bChurnTLS is the churn matrix over TLS: HTTP/2 by ALPN, and
// HTTP/1.1.
func TestAdv75bChurnTLS(t *testing.T) {
	for _, proto := range []string{"h2tls", "h1tls"} {
		for _, cap := range []int{1, 3} {
			for _, drain := range []string{"spare", "short"} {
				t.Run(fmt.Sprintf("%s/cap%d/%s", proto, cap, drain), func(t *testing.T) {
					adv75bChurn(t, proto, cap, drain == "short", testSpec.Lanes)
				})
			}
		}
	}
}

// TestAdv75bChurnLaneReuse is the churn with a segment of five lanes: an
// observer, two
// stable members, and each joiner takes the lane the member before the
// last left, so every lane (and socket path) is reused at once, with
// siblings' idle streams and leases for its previous holder still about.
func TestAdv75bChurnLaneReuse(t *testing.T) {
	for _, proto := range []string{"h1", "h2c"} {
		for _, cap := range []int{1, 3} {
			for _, drain := range []string{"spare", "short"} {
				t.Run(fmt.Sprintf("%s/cap%d/%s", proto, cap, drain), func(t *testing.T) {
					adv75bChurn(t, proto, cap, drain == "short", 5)
				})
			}
		}
	}
}

func adv75bChurn(t *testing.T, proto string, cap int, short bool, lanes int) {
	u := newAdv75bUpstream(t, nil)
	url := u.srv.URL
	if short {
		u.delay = func() time.Duration { return 30 * time.Millisecond }
	} else {
		u.delay = func() time.Duration { return 2 * time.Millisecond }
	}
	var roots *x509.CertPool
	switch proto {
	case "h2c":
		h := newH2CServer(t, u.srv.Config.Handler.ServeHTTP)
		url = h.url
	case "h2tls", "h1tls":
		ts := httptest.NewUnstartedServer(u.srv.Config.Handler)
		ts.EnableHTTP2 = proto == "h2tls"
		ts.StartTLS()
		t.Cleanup(ts.Close)
		url = ts.URL
		roots = x509.NewCertPool()
		roots.AddCert(ts.Certificate())
	}
	spec := testSpec
	spec.Lanes = lanes
	spec.Path = filepath.Join(t.TempDir(), "seg")
	obs, err := orbitpool.Open(spec, orbitpool.Options{ReconcileInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer obs.Close()
	conf := func(tr *Transport) {
		tr.MaxConnsPerKey = cap
		tr.H2C = proto == "h2c"
		if roots != nil {
			tr.HTTP2 = proto == "h2tls"
			tr.TLSClientConfig = &tls.Config{RootCAs: roots}
		}
	}
	join := func() *member {
		m := newMember(t, spec, conf)
		req, _ := http.NewRequest("GET", url+"/?q=own", nil)
		if resp, err := m.tr.RoundTrip(req); err == nil {
			drain(resp)
		}
		return m
	}
	old := join()
	s1 := newMember(t, spec, conf)
	s2 := newMember(t, spec, conf)
	load := startAdv75bLoadURL(t, u, url, "m", 8*time.Second, map[*member]int{s1: 4, s2: 4})
	for cycle := range 20 {
		time.Sleep(30 * time.Millisecond)
		next := join()
		d := 8 * time.Second
		if short {
			d = 20 * time.Millisecond
		}
		ctx, cancel := context.WithTimeout(context.Background(), d)
		start := time.Now()
		old.node.Shutdown(ctx)
		cancel()
		if el := time.Since(start); el > d+5*time.Second {
			t.Errorf("cycle %d: Shutdown took %v with a drain of %v", cycle, el, d)
		}
		old.pool.Close()
		old = next
	}
	time.Sleep(100 * time.Millisecond)
	load.stop()
	all, unsent, wrong := load.failures()
	if (!short && len(all) != 0) || unsent != 0 || wrong != 0 {
		t.Errorf("%d of %d requests failed (%d never reached the upstream, %d wrong answers): %s",
			len(all), load.sent.Load(), unsent, wrong, adv75bFirst(all, 8))
	}
	if d := u.dupPosts(); len(d) != 0 {
		t.Errorf("POSTs reached the upstream more than once: %v", d)
	}
	if n := load.slow.Load(); n != 0 {
		t.Errorf("%d requests returned well after their own deadline", n)
	}
	if load.ok.Load() < 30 {
		t.Errorf("only %d requests succeeded", load.ok.Load())
	}
	old.node.Close()
	s1.node.Close()
	s2.node.Close()
	adv71cTableQuiet(t, obs, 5*time.Second)
}
