package proxy

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestAdv73aKillStormPostsAtMostOnce: owners join the fleet, take the
// upstream's connections, and are killed at a random instant while a
// sibling sends unreplayable POSTs (and GETs) through them: capped (every
// request relays while the owner holds the key's connections), and uncapped
// with RelayUnreplayable (POSTs relay, and relays pay for dials of the
// client's own). No POST may reach the upstream twice; a POST whose error is
// retry-safe must never have reached it; a 200 carries its own request's
// answer.
func TestAdv73aKillStormPostsAtMostOnce(t *testing.T) {
	for _, tc := range []struct {
		name string
		tls  bool
		conf func(*Transport)
	}{
		{"capped", false, func(tr *Transport) { tr.MaxConnsPerKey = 2 }},
		{"uncapped-relay-unreplayable", false, func(tr *Transport) { tr.RelayUnreplayable = true }},
		{"tls-capped", true, func(tr *Transport) { tr.MaxConnsPerKey = 2 }},
		{"tls-uncapped-relay-unreplayable", true, func(tr *Transport) { tr.RelayUnreplayable = true }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var seen sync.Map // X-Id -> *atomic.Int32
			up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				id := r.Header.Get("X-Id")
				v, _ := seen.LoadOrStore(id, new(atomic.Int32))
				v.(*atomic.Int32).Add(1)
				io.Copy(io.Discard, r.Body)
				time.Sleep(time.Duration(rand.IntN(3000)) * time.Microsecond)
				io.WriteString(w, "id="+id)
			}))
			conf := tc.conf
			if tc.tls {
				up.StartTLS()
				roots := x509.NewCertPool()
				roots.AddCert(up.Certificate())
				conf = func(tr *Transport) {
					tc.conf(tr)
					tr.TLSClientConfig = &tls.Config{RootCAs: roots}
				}
			} else {
				up.Start()
			}
			t.Cleanup(up.Close)
			spec := testSpec
			spec.Path = filepath.Join(t.TempDir(), "seg")
			client := newMember(t, spec, conf)

			var (
				mu      sync.Mutex
				posts   = map[string]bool{}
				postErr = map[string]error{}
				getErrs []string
				seq     atomic.Int64
			)
			do := func(method string) {
				id := fmt.Sprintf("r%d", seq.Add(1))
				var body io.Reader
				if method == "POST" {
					body = strings.NewReader("payload")
					mu.Lock()
					posts[id] = true
					mu.Unlock()
				}
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				req, _ := http.NewRequestWithContext(ctx, method, up.URL+"/x", body)
				req.Header.Set("X-Id", id)
				resp, err := client.tr.RoundTrip(req)
				if err == nil {
					var b []byte
					b, err = io.ReadAll(resp.Body)
					resp.Body.Close()
					if err == nil && (resp.StatusCode != 200 || string(b) != "id="+id) {
						t.Errorf("%s %s: got %d %q", method, id, resp.StatusCode, b)
					}
				}
				if err != nil {
					mu.Lock()
					if method == "POST" {
						postErr[id] = err
					} else {
						getErrs = append(getErrs, fmt.Sprintf("%s: %v", id, err))
					}
					mu.Unlock()
				}
			}
			for round := range 6 {
				client.tr.CloseIdleConnections()
				owner := newMember(t, spec, conf)
				var wg sync.WaitGroup
				for range 2 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						warm(t, owner, up.URL+"/warm")
					}()
				}
				wg.Wait()
				stop := make(chan struct{})
				for g := range 4 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for i := 0; ; i++ {
							select {
							case <-stop:
								return
							default:
							}
							m := "POST"
							if (i+g)%3 == 0 {
								m = "GET"
							}
							do(m)
						}
					}()
				}
				time.Sleep(time.Duration(20+rand.IntN(150)) * time.Millisecond)
				owner.dieAsKilled()
				time.Sleep(50 * time.Millisecond)
				close(stop)
				wg.Wait()
				_ = round
			}
			time.Sleep(100 * time.Millisecond)
			mu.Lock()
			defer mu.Unlock()
			for id := range posts {
				v, ok := seen.Load(id)
				c := int32(0)
				if ok {
					c = v.(*atomic.Int32).Load()
				}
				if c > 1 {
					t.Errorf("POST %s (not replayable) reached the upstream %d times", id, c)
				}
				if err, failed := postErr[id]; failed && IsRetrySafe(err) && c > 0 {
					t.Errorf("POST %s failed retry-safe (%v) but reached the upstream", id, err)
				}
			}
			if len(getErrs) > 0 {
				t.Errorf("%d GETs failed, first: %v", len(getErrs), getErrs[:min(5, len(getErrs))])
			}
			t.Logf("%d requests, %d POSTs failed; client %+v", seq.Load(), len(postErr), client.node.Stats())
		})
	}
}
