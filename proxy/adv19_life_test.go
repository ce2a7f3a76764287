package proxy

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// adv19Upstream answers every request with the id it carries (header X-Id)
// and the length of the body it read, after a short random pause; it counts
// each id it saw, so that a POST sent upstream twice shows.
type adv19Upstream struct {
	srv  *httptest.Server
	mu   sync.Mutex
	seen map[string]int
}

func newAdv19Upstream(t *testing.T, pause time.Duration) *adv19Upstream {
	u := &adv19Upstream{seen: map[string]int{}}
	u.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		id := r.Header.Get("X-Id")
		u.mu.Lock()
		u.seen[r.Method+" "+id]++
		u.mu.Unlock()
		if r.URL.Path == "/hold" {
			time.Sleep(100 * time.Millisecond)
		} else if pause > 0 {
			time.Sleep(time.Duration(rand.Int63n(int64(pause))))
		}
		size := 10
		if strings.HasSuffix(r.URL.Path, "/big") {
			size = 200 << 10
		}
		w.Header().Set("Content-Length", fmt.Sprint(size+len(id)+20))
		fmt.Fprintf(w, "%s %019d", id, n)
		w.Write(bytes.Repeat([]byte("x"), size))
	}))
	t.Cleanup(func() {
		u.srv.CloseClientConnections()
		u.srv.Close()
	})
	return u
}

func (u *adv19Upstream) dups() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	var out []string
	for k, v := range u.seen {
		if v > 1 && strings.HasPrefix(k, "POST") {
			out = append(out, fmt.Sprintf("%s x%d", k, v))
		}
	}
	return out
}

// adv19Load runs workers goroutines of sequential requests through rt until
// stop closes: GETs, short POSTs (sent with their head), and long streamed
// POSTs without GetBody (not replayable), some of them with a large
// response. It returns the failures, each described.
func adv19Load(rt http.RoundTripper, base string, workers int, stop <-chan struct{}, total *atomic.Int64) []string {
	var (
		mu   sync.Mutex
		fail []string
		wg   sync.WaitGroup
	)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				id := fmt.Sprintf("w%d-%d", w, i)
				path := "/small"
				if i%3 == 0 {
					path = "/big"
				}
				var req *http.Request
				var blen int
				switch i % 4 {
				case 0:
					req, _ = http.NewRequest("GET", base+path, nil)
				case 1:
					blen = 100
					req = postOnce(base+path, strings.Repeat("p", blen))
				default:
					blen = 64 << 10
					req, _ = http.NewRequest("POST", base+path, io.NopCloser(bytes.NewReader(bytes.Repeat([]byte("q"), blen))))
					req.ContentLength = int64(blen)
				}
				req.Header.Set("X-Id", id)
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				resp, err := rt.RoundTrip(req.WithContext(ctx))
				var got string
				if err == nil {
					var b []byte
					b, err = io.ReadAll(resp.Body)
					resp.Body.Close()
					got = string(b)
					if err == nil && !strings.HasPrefix(got, fmt.Sprintf("%s %019d", id, blen)) {
						err = fmt.Errorf("wrong body %.40q", got)
					}
				}
				cancel()
				total.Add(1)
				if err != nil {
					mu.Lock()
					fail = append(fail, fmt.Sprintf("%s %s %s: %v", req.Method, path, id, err))
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	return fail
}

// TestAdv19OwnerShutdownUnderSiblingLoad: two owners hold all of a key's
// connections (cap 4, two each); a third member sends a steady load through
// them (GETs, short and streamed POSTs, small and large answers). One owner
// leaves the fleet gracefully (Node.Shutdown, then its pool, as the Caddy
// app's Destruct does) while the load runs, and a new member joins after.
// Stock Caddy in the sibling would have served every request: none may
// fail, and no POST may reach the upstream twice.
func TestAdv19OwnerShutdownUnderSiblingLoad(t *testing.T) {
	t.Run("two-owners", func(t *testing.T) { testAdv19OwnerShutdown(t, 4, 12, false) })
	t.Run("sole-owner-queued", func(t *testing.T) { testAdv19OwnerShutdown(t, 2, 24, true) })
}

func testAdv19OwnerShutdown(t *testing.T, capN, workers int, sole bool) {
	u := newAdv19Upstream(t, 20*time.Millisecond)
	spec := testSpec
	spec.Path = filepath.Join(t.TempDir(), "seg")
	conf := func(tr *Transport) { tr.MaxConnsPerKey = capN }
	a := newMember(t, spec, conf)
	b := newMember(t, spec, conf)
	c := newMember(t, spec, conf)
	owners := []*member{a, a, b, b}
	if sole {
		owners = []*member{a, a}
	}
	// All at once, each held 100ms upstream: none finds another's idle.
	var wg sync.WaitGroup
	for _, m := range owners {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequest("GET", u.srv.URL+"/hold", nil)
			req.Header.Set("X-Id", "warm")
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			resp, err := m.tr.RoundTrip(req.WithContext(ctx))
			if err != nil {
				t.Error(err)
				return
			}
			drain(resp)
		}()
	}
	wg.Wait()
	if a.node.Stats().OpenConns+b.node.Stats().OpenConns != len(owners) {
		t.Fatalf("warm: a %+v b %+v", a.node.Stats(), b.node.Stats())
	}

	stop := make(chan struct{})
	var total atomic.Int64
	res := make(chan []string, 1)
	go func() { res <- adv19Load(c.tr, u.srv.URL, workers, stop, &total) }()
	time.Sleep(300 * time.Millisecond)
	before := total.Load()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	start := time.Now()
	if err := a.node.Shutdown(ctx); err != nil {
		t.Error(err)
	}
	cancel()
	a.pool.Close()
	took := time.Since(start)
	time.Sleep(200 * time.Millisecond)
	d := newMember(t, spec, conf)
	_ = d
	time.Sleep(400 * time.Millisecond)
	close(stop)
	fail := <-res
	t.Logf("%d requests (%d before the shutdown), shutdown took %s; c %+v", total.Load(), before, took, c.node.Stats())
	if len(fail) > 0 {
		n := min(len(fail), 10)
		t.Errorf("%d of %d requests failed across an owner's graceful leave; first %d:\n%s", len(fail), total.Load(), n, strings.Join(fail[:n], "\n"))
	}
	if dd := u.dups(); len(dd) > 0 {
		t.Errorf("POSTs the upstream saw twice: %v", dd)
	}
}
