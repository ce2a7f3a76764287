package proxy

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestAdv71ePlainCloseNeverReplaysPOST: a sibling sends POSTs (no GetBody,
// unique bodies) through an owner without pause while the owner's Node
// closes without a drain. Close now refuses, retry-safe, every stream that
// carries no exchange; a POST that reached the upstream must never be
// answered with that refusal (or any retry-safe failure) and sent again:
// the upstream sees each body at most once. Several rounds, each a fresh
// pair, the Close at a different instant.
func TestAdv71ePlainCloseNeverReplaysPOST(t *testing.T) {
	var mu sync.Mutex
	seen := map[string]int{}
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if r.Method == "POST" {
			mu.Lock()
			seen[string(b)]++
			mu.Unlock()
			time.Sleep(time.Duration(rand.IntN(3000)) * time.Microsecond)
		}
		io.WriteString(w, "ok")
	}))
	defer up.Close()
	defer up.CloseClientConnections()
	sent := 0
	var remote uint64
	for round := range 6 {
		owner, client := remotePair(t, nil)
		warm(t, owner, up.URL+"/warm")
		stop := make(chan struct{})
		var wg sync.WaitGroup
		var smu sync.Mutex
		for g := range 12 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					body := fmt.Sprintf("r%d-g%d-i%d", round, g, i)
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					req, _ := http.NewRequestWithContext(ctx, "POST", up.URL+"/p", io.NopCloser(strings.NewReader(body)))
					req.ContentLength = int64(len(body))
					resp, err := client.tr.RoundTrip(req)
					if err == nil {
						io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
					}
					cancel()
					smu.Lock()
					sent++
					smu.Unlock()
				}
			}()
		}
		time.Sleep(time.Duration(30+rand.IntN(60)) * time.Millisecond)
		closed := make(chan struct{})
		go func() { defer close(closed); owner.node.Close() }()
		select {
		case <-closed:
		case <-time.After(10 * time.Second):
			close(stop)
			t.Fatal("owner Close hung")
		}
		time.Sleep(50 * time.Millisecond)
		close(stop)
		wg.Wait()
		remote += client.node.Stats().ReusedRemote
		client.node.Close()
	}
	mu.Lock()
	defer mu.Unlock()
	var twice []string
	for b, n := range seen {
		if n > 1 {
			twice = append(twice, fmt.Sprintf("%s x%d", b, n))
		}
	}
	if len(twice) > 0 {
		t.Fatalf("the upstream saw %d POSTs more than once (of %d sent): %v", len(twice), sent, twice)
	}
	if remote < 50 {
		t.Fatalf("only %d POSTs went through the owner", remote)
	}
	if len(seen) < 100 {
		t.Fatalf("only %d POSTs reached the upstream; the test sent too few to say anything", len(seen))
	}
}
