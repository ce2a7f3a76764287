package proxy

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"log"
	mrand "math/rand/v2"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/orbitpool"
)

// TestAdv74aPaidDialsKeyChurn: a table with fewer key entries and slots than
// upstreams (Keys 2, two slots a lane, 5 upstreams), three processes sending
// GETs and unreplayable POSTs (RelayUnreplayable, so POSTs relay and pay
// for dials too) to every upstream in turn for about 1.5s, uncapped, so
// relays keep paying for dials while key entries and slots are recycled
// between keys. Properties: every 200 carries its own request's answer from
// the upstream it was sent to; no POST reaches an upstream twice; a POST
// whose error is retry-safe never reached one; every request ends by its
// deadline plus a grace; afterwards each process's counts match what it
// holds, nothing is dialing or queued for room, and once idle connections
// are closed nothing is live in the table.
func TestAdv74aPaidDialsKeyChurn(t *testing.T) {
	for _, withTLS := range []bool{false, true} {
		t.Run(fmt.Sprintf("tls=%v", withTLS), func(t *testing.T) { adv74aKeyChurn(t, withTLS) })
	}
}

// adv74aKeyChurn is TestAdv74aPaidDialsKeyChurn over plain or TLS
// upstreams; TLS ones delay each handshake 5-15ms, so that paid dials are
// in flight while keys and slots are recycled.
func adv74aKeyChurn(t *testing.T, withTLS bool) {
	const nUp = 5
	burstLen := 6
	if withTLS {
		burstLen = relaysPerTLSDial + 8
	}
	var roots *x509.CertPool
	var posts sync.Map // id -> *atomic.Int32
	var ups []string
	for i := range nUp {
		name := fmt.Sprintf("up%d", i)
		s := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			id := r.Header.Get("X-Id")
			if r.Method == "POST" {
				v, _ := posts.LoadOrStore(id, new(atomic.Int32))
				v.(*atomic.Int32).Add(1)
			}
			io.Copy(io.Discard, r.Body)
			if strings.HasSuffix(r.URL.Path, "/slow") {
				time.Sleep(3 * time.Millisecond)
			}
			io.WriteString(w, name+":"+id)
		}))
		if withTLS {
			s.Config.ErrorLog = log.New(io.Discard, "", 0)
			s.TLS = &tls.Config{GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
				time.Sleep(time.Duration(5+mrand.IntN(10)) * time.Millisecond)
				return nil, nil
			}}
			s.StartTLS()
			if roots == nil {
				roots = x509.NewCertPool()
			}
			roots.AddCert(s.Certificate())
		} else {
			s.Start()
		}
		t.Cleanup(s.Close)
		ups = append(ups, s.URL)
	}
	spec := orbitpool.PoolSpec{Lanes: 4, Keys: 2, ResourcesPerLane: 2, Path: filepath.Join(t.TempDir(), "seg")}
	var ms []*member
	for range 3 {
		ms = append(ms, newMember(t, spec, func(tr *Transport) {
			tr.RelayUnreplayable = true
			if withTLS {
				tr.TLSClientConfig = &tls.Config{RootCAs: roots}
			}
		}))
	}
	var seq atomic.Int64
	var postRetrySafe sync.Map // id -> error
	stop := time.Now().Add(1500 * time.Millisecond)
	var wg sync.WaitGroup
	for w := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m := ms[w%3]
			for i := 0; time.Now().Before(stop); i++ {
				n := seq.Add(1)
				id := fmt.Sprintf("w%dn%d", w, n)
				// Bursts to one upstream (so relays add up to a
				// paid dial), then the next.
				ui := (i/burstLen + w) % nUp
				method := "GET"
				if i%3 == 2 {
					method = "POST"
				}
				path := "/"
				if i%4 == 0 {
					path = "/slow"
				}
				d := 2 * time.Second
				if i%7 == 3 {
					d = 40 * time.Millisecond // short deadlines too
				}
				ctx, cancel := context.WithTimeout(context.Background(), d)
				var body io.Reader
				if method == "POST" {
					body = strings.NewReader("payload-" + id)
				}
				req, _ := http.NewRequestWithContext(ctx, method, ups[ui]+path, body)
				req.Header.Set("X-Id", id)
				start := time.Now()
				resp, err := m.tr.RoundTrip(req)
				if err == nil {
					b, rerr := io.ReadAll(resp.Body)
					resp.Body.Close()
					want := fmt.Sprintf("up%d:%s", ui, id)
					if rerr == nil && (resp.StatusCode != 200 || string(b) != want) {
						t.Errorf("%s %s to up%d: got %d %q, want %q", method, id, ui, resp.StatusCode, b, want)
					}
				} else if method == "POST" && IsRetrySafe(err) {
					postRetrySafe.Store(id, err)
				}
				cancel()
				if took := time.Since(start); took > d+300*time.Millisecond {
					t.Errorf("%s %s: took %v, deadline %v (err %v)", method, id, took.Round(time.Millisecond), d, err)
				}
			}
		}()
	}
	wg.Wait()
	posts.Range(func(k, v any) bool {
		if c := v.(*atomic.Int32).Load(); c > 1 {
			t.Errorf("POST %s reached its upstream %d times", k, c)
		}
		if e, ok := postRetrySafe.Load(k); ok {
			t.Errorf("POST %s reached its upstream but failed retry-safe: %v", k, e)
		}
		return true
	})
	var relayDials uint64
	for _, m := range ms {
		relayDials += m.node.Stats().RelayDials
	}
	t.Logf("%d requests, %d relay dials", seq.Load(), relayDials)
	if !withTLS && relayDials == 0 {
		t.Errorf("no relay dial happened: the test proves nothing about them")
	}
	for i, m := range ms {
		waitFor(t, 3*time.Second, fmt.Sprintf("member %d to settle", i), func() bool {
			o, h := adv70Counted(m)
			return o == int64(h) && m.node.dialing.Load() == 0 && m.node.room.n.Load() == 0
		})
	}
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		live := 0
		for _, m := range ms {
			m.tr.CloseIdleConnections()
		}
		s, err := ms[0].pool.Snapshot()
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range s.Keys {
			live += k.Live + k.Creating + k.InUse + k.Pending
		}
		if live == 0 {
			break
		}
		if time.Now().Add(20 * time.Millisecond).After(end) {
			t.Errorf("after CloseIdleConnections with nothing running: %+v", s.Keys)
		}
	}
	for i, m := range ms {
		if o, h := adv70Counted(m); o != 0 || h != 0 {
			t.Errorf("member %d: n.open %d, held %d after closing idle connections", i, o, h)
		}
	}
}
