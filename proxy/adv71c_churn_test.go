package proxy

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestAdv71cReloadChurnNoFailedRequests: reloads under load. A stable
// member (s) sends GETs and POSTs (with bodies) through the fleet while,
// three times over, a member that owns connections leaves by Shutdown with
// time to spare and a new one joins. A graceful leave loses no request: each
// one succeeds with its own answer (a POST that reached the upstream is
// never refused, and one refused was never sent), no POST reaches the
// upstream twice; and once every member has closed, a process reading the
// table finds nothing live, reserved or in use.
func TestAdv71cReloadChurnNoFailedRequests(t *testing.T) {
	var mu sync.Mutex
	seen := map[string]int{}
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if r.Method == "POST" {
			mu.Lock()
			seen[string(b)]++
			mu.Unlock()
		}
		time.Sleep(5 * time.Millisecond)
		io.WriteString(w, r.Method+":"+string(b)+":"+r.URL.Query().Get("q"))
	}))
	defer up.Close()
	spec, obs := observedSegment(t)
	conf := func(tr *Transport) { tr.MaxConnsPerKey = 3 }
	stable := newMember(t, spec, conf)
	old := newMember(t, spec, conf)

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var sent, failed atomic.Int64
	fails := make(chan string, 16)
	var seq atomic.Int64
	load := func(m *member, w int) {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			i := seq.Add(1)
			method, body := "GET", ""
			var rb io.Reader
			if i%2 == 0 {
				method, body = "POST", fmt.Sprintf("p%d", i)
				rb = strings.NewReader(body)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
			req, _ := http.NewRequestWithContext(ctx, method, fmt.Sprintf("%s/?q=%d", up.URL, i), rb)
			sent.Add(1)
			resp, err := m.tr.RoundTrip(req)
			var got []byte
			if err == nil {
				got, err = io.ReadAll(resp.Body)
				resp.Body.Close()
			}
			cancel()
			want := fmt.Sprintf("%s:%s:%d", method, body, i)
			if err != nil || string(got) != want {
				failed.Add(1)
				select {
				case fails <- fmt.Sprintf("worker %d %s %d: %q %v", w, method, i, got, err):
				default:
				}
			}
		}
	}
	// old owns the key's connections first: the stable member's requests
	// go through it.
	var warmWG sync.WaitGroup
	for range 3 {
		warmWG.Add(1)
		go func() {
			defer warmWG.Done()
			req, _ := http.NewRequest("POST", up.URL+"/?q=warm", strings.NewReader("warm"))
			if resp, err := old.tr.RoundTrip(req); err == nil {
				drain(resp)
			}
		}()
	}
	warmWG.Wait()
	mu.Lock()
	delete(seen, "warm")
	mu.Unlock()
	for w := range 6 {
		wg.Add(1)
		go load(stable, w)
	}
	stopAll := func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		wg.Wait()
	}
	defer stopAll()
	// old's own load, which a reload's old config finishes before its
	// membership leaves: it stops before old's Shutdown.
	var oldWG sync.WaitGroup
	oldStop := make(chan struct{})
	oldLoad := func(m *member) {
		defer oldWG.Done()
		for {
			select {
			case <-oldStop:
				return
			default:
			}
			req, _ := http.NewRequest("GET", up.URL+"/?q=own", nil)
			if resp, err := m.tr.RoundTrip(req); err == nil {
				drain(resp)
			}
		}
	}
	for cycle := range 3 {
		oldStop = make(chan struct{})
		for range 2 {
			oldWG.Add(1)
			go oldLoad(old)
		}
		time.Sleep(150 * time.Millisecond)
		close(oldStop)
		oldWG.Wait()
		next := newMember(t, spec, conf)
		ctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
		err := old.node.Shutdown(ctx)
		cancel()
		if err != nil {
			stopAll()
			t.Fatalf("cycle %d: Shutdown: %v", cycle, err)
		}
		old.pool.Close()
		old = next
	}
	time.Sleep(150 * time.Millisecond)
	stopAll()
	close(fails)
	if n := failed.Load(); n != 0 {
		var all []string
		for f := range fails {
			all = append(all, f)
		}
		t.Errorf("%d of %d requests of the stable member failed across graceful reloads: %s", n, sent.Load(), strings.Join(all, "; "))
	}
	if stable.node.Stats().ReusedRemote == 0 {
		t.Errorf("the stable member never used a leaving member's connection: %+v", stable.node.Stats())
	}
	mu.Lock()
	for b, n := range seen {
		if n != 1 {
			t.Errorf("POST %s reached the upstream %d times", b, n)
		}
	}
	mu.Unlock()
	old.node.Close()
	stable.node.Close()
	adv71cTableQuiet(t, obs, 3*time.Second)
}
