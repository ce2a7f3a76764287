package proxy

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/governor"
)

// TestAdv75bShutdownWhileWaitingForWorker: the owner's governor has one
// worker. A sibling's GET holds it (the upstream holds its answer); more
// siblings' requests (GETs and POSTs) have their heads on the owner, waiting
// for the worker, when the owner begins Shutdown with 10s to spare; then
// the upstream answers. Every request must succeed with its own answer
// (the waiting ones had not reached the upstream: they go elsewhere or run
// on the owner), and no POST may reach the upstream twice.
//
// The "short" case: Shutdown's drain is 200 ms and the upstream answers
// only after Shutdown has returned. The held request may fail; every one
// that waited for the worker never reached the upstream and must succeed
// elsewhere.
func TestAdv75bShutdownWhileWaitingForWorker(t *testing.T) {
	t.Run("spare", func(t *testing.T) { adv75bWorkerWait(t, false, "GET") })
	t.Run("short", func(t *testing.T) { adv75bWorkerWait(t, true, "GET") })
	t.Run("short-post", func(t *testing.T) { adv75bWorkerWait(t, true, "POST") })
}

func adv75bWorkerWait(t *testing.T, short bool, holdMethod string) {
	gate := make(chan struct{})
	var gateOnce sync.Once
	openGate := func() { gateOnce.Do(func() { close(gate) }) }
	t.Cleanup(openGate)
	var mu sync.Mutex
	seen := map[string]int{}
	var hits atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		q := r.URL.Query().Get("q")
		mu.Lock()
		seen[q]++
		mu.Unlock()
		hits.Add(1)
		if q == "hold" {
			<-gate
		}
		if q == "warm" {
			time.Sleep(100 * time.Millisecond)
		}
		io.WriteString(w, r.Method+":"+string(b)+":"+q)
	}))
	t.Cleanup(up.Close)
	spec := testSpec
	spec.Path = filepath.Join(t.TempDir(), "seg")
	conf := func(tr *Transport) { tr.MaxConnsPerKey = 2 }
	// Two workers, one of which the test holds once the connections are
	// made: the owner then runs one exchange at a time.
	gov := governor.New(2, 1<<30)
	owner := newMemberOpts(t, spec, NodeOptions{SweepInterval: 50 * time.Millisecond,
		Governor: gov, MaxLeaseWait: 5 * time.Second}, conf)
	client := newMember(t, spec, conf)
	// Two owner connections, idle.
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequest("GET", up.URL+"/?q=warm", nil)
			if resp, err := owner.tr.RoundTrip(req); err == nil {
				drain(resp)
			}
		}()
	}
	wg.Wait()
	if owner.node.Stats().Created != 2 {
		t.Fatalf("owner made %d connections, want 2", owner.node.Stats().Created)
	}
	held := gov.Acquire()
	defer held.Release()
	type res struct {
		q, method, body string
		got             string
		err             error
	}
	out := make(chan res, 8)
	send := func(q, method, body string) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var rb io.Reader
		if body != "" {
			rb = io.NopCloser(strings.NewReader(body))
		}
		req, _ := http.NewRequestWithContext(ctx, method, up.URL+"/?q="+q, rb)
		if body != "" {
			req.ContentLength = int64(len(body))
		}
		resp, err := client.tr.RoundTrip(req)
		var got []byte
		if err == nil {
			got, err = io.ReadAll(resp.Body)
			resp.Body.Close()
		}
		out <- res{q, method, body, string(got), err}
	}
	holdBody := ""
	if holdMethod == "POST" {
		holdBody = "holdbody"
	}
	go send("hold", holdMethod, holdBody)
	waitFor(t, 5*time.Second, "the held request to reach the upstream", func() bool { return hits.Load() >= 3 })
	// The next requests lease the owner's other connection, or wait for
	// one; either way their heads wait for the owner's one worker.
	n := 1
	for i := range 3 {
		method, body := "GET", ""
		if i%2 == 1 {
			method, body = "POST", fmt.Sprintf("body%d", i)
		}
		go send(fmt.Sprintf("w%d", i), method, body)
		n++
	}
	time.Sleep(300 * time.Millisecond)
	if hits.Load() != 3 {
		t.Fatalf("%d requests reached the upstream while the owner's one worker was held", hits.Load()-2)
	}
	shut := make(chan error, 1)
	drainFor := 10 * time.Second
	if short {
		drainFor = 200 * time.Millisecond
	}
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), drainFor)
		defer cancel()
		shut <- owner.node.Shutdown(ctx)
	}()
	if short {
		select {
		case <-shut:
		case <-time.After(15 * time.Second):
			t.Fatal("Shutdown hung")
		}
		shut <- nil
		time.Sleep(100 * time.Millisecond)
	} else {
		time.Sleep(100 * time.Millisecond)
	}
	openGate()
	for range n {
		select {
		case r := <-out:
			want := r.method + ":" + r.body + ":" + r.q
			if short && r.q == "hold" && r.err != nil {
				continue // it was at the upstream when the drain ran out
			}
			if r.err != nil || r.got != want {
				t.Errorf("%s %s: got %q, %v; want %q (the upstream saw it %d times)", r.method, r.q, r.got, r.err, want, func() int { mu.Lock(); defer mu.Unlock(); return seen[r.q] }())
			}
		case <-time.After(20 * time.Second):
			t.Fatal("a request hung")
		}
	}
	select {
	case <-shut:
	case <-time.After(15 * time.Second):
		t.Fatal("Shutdown hung")
	}
	mu.Lock()
	defer mu.Unlock()
	for q, c := range seen {
		if q == "hold" && c > 0 && holdMethod == "GET" {
			continue // a GET the owner's end cut: net/http retries those too
		}
		if q != "warm" && c != 1 {
			t.Errorf("request %s reached the upstream %d times", q, c)
		}
	}
}
