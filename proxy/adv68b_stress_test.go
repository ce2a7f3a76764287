package proxy

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/governor"
)

type panicOwnerWaits struct{ recordWaits }

func (*panicOwnerWaits) OwnerWaited(time.Duration) { panic("owner waited") }

// TestAdv68bPanickingOwnerWaitedLeavesNothingTaken: a watcher that panics
// when told of the owner's wait (on the reading goroutine, after the accept
// released a long body to go) fails that request with an error, and leaves
// neither the sibling's stream nor the owner's worker and connection
// taken: with one worker and one connection for the key, the next
// requests, through the sibling and at the owner, are served promptly.
func TestAdv68bPanickingOwnerWaitedLeavesNothingTaken(t *testing.T) {
	ts := httptest.NewServer(http.HandlerFunc(adv68bHandler))
	t.Cleanup(ts.Close)
	gov := governor.New(1, 0)
	owner, client := budgetFleet(t, NodeOptions{Governor: gov, MaxLeaseWait: 5 * time.Second}, func(tr *Transport) { tr.MaxConnsPerKey = 1 })
	warm(t, owner, ts.URL+"/plain")
	large := bytes.Repeat([]byte("x"), 256<<10)
	for _, kind := range []string{"GET", "large POST"} {
		releaseAfter(t, gov, 60*time.Millisecond)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		var req *http.Request
		if kind == "GET" {
			req, _ = http.NewRequestWithContext(WithWaitWatcher(ctx, &panicOwnerWaits{}), "GET", ts.URL+"/plain", nil)
		} else {
			req, _ = http.NewRequestWithContext(WithWaitWatcher(ctx, &panicOwnerWaits{}), "POST", ts.URL+"/plain", bytes.NewReader(large))
		}
		resp, err := client.tr.RoundTrip(req)
		if err == nil {
			drain(resp)
			cancel()
			t.Fatalf("%s: a request whose watcher panicked succeeded", kind)
		}
		cancel()
		for i, rt := range []http.RoundTripper{client.tr, owner.tr} {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			start := time.Now()
			err := getBody(ctx, rt, ts.URL+"/plain")
			cancel()
			if err != nil {
				t.Fatalf("%s: request %d after the panic: %v (client %+v owner %+v)", kind, i, err, client.node.Stats(), owner.node.Stats())
			}
			if d := time.Since(start); d > time.Second {
				t.Errorf("%s: request %d after the panic took %v", kind, i, d)
			}
		}
	}
}

// TestAdv68bConcurrentWaitsToldAtMostOnceAndBounded: many siblings'
// requests through an owner with two workers, some of them long POSTs
// that take the accept early, race for the workers (-race): each watcher
// is told of the owner's wait at most once, never more than its round
// trip took, and every response is whole.
func TestAdv68bConcurrentWaitsToldAtMostOnceAndBounded(t *testing.T) {
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(15 * time.Millisecond)
		adv68bHandler(w, r)
	}))
	t.Cleanup(ts.Close)
	gov := governor.New(2, 0)
	owner, client := budgetFleet(t, NodeOptions{Governor: gov, MaxLeaseWait: 5 * time.Second}, func(tr *Transport) { tr.MaxConnsPerKey = 4 })
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() { defer wg.Done(); warm(t, owner, ts.URL+"/plain") }()
	}
	wg.Wait()
	before := owner.node.Stats().ServedRemote
	const n = 24
	errs := make(chan error, n)
	waited := 0
	var mu sync.Mutex
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
			defer cancel()
			w := &orderWaits{}
			var body []byte
			path := "/plain"
			if i%3 == 0 {
				path = "/interim"
			}
			var req *http.Request
			if i%2 == 0 {
				body = bytes.Repeat([]byte{byte(i)}, 100<<10)
				req, _ = http.NewRequestWithContext(WithWaitWatcher(ctx, w), "POST", ts.URL+path, bytes.NewReader(body))
			} else {
				req, _ = http.NewRequestWithContext(WithWaitWatcher(ctx, w), "GET", ts.URL+path, nil)
			}
			start := time.Now()
			resp, err := client.tr.RoundTrip(req)
			if err != nil {
				errs <- err
				return
			}
			b, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			elapsed := time.Since(start)
			if err != nil || string(b) != adv68bWant(body) {
				errs <- fmt.Errorf("request %d: %q %v", i, b, err)
				return
			}
			ev, ds := w.snapshot()
			if len(ds) > 1 || len(ds) == 1 && (ds[0] <= 0 || ds[0] > elapsed) {
				errs <- fmt.Errorf("request %d: owner waits %v (events %q) in a round trip of %v", i, ds, ev, elapsed)
			}
			if len(ds) == 1 {
				mu.Lock()
				waited++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	served := owner.node.Stats().ServedRemote - before
	t.Logf("owner served %d of %d remotely; %d told of a wait", served, n, waited)
	if served > 4 && waited == 0 {
		t.Errorf("owner served %d requests with two workers and none was told of a wait", served)
	}
}
