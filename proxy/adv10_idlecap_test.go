package proxy

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestAdv10IdleCapLosesNoSentFrame: an owner caps the streams of one peer
// that wait for their next frame, and closes those beyond the cap. Under a
// burst from one sibling more of its streams than the cap are between two
// exchanges at once, and the sibling may have sent its next frame on one
// the owner is closing: that request (here a POST whose streamed body
// cannot be replayed) must be sent again, not fail as if the owner had
// died with it. The cap is lowered to 4 so that a dozen concurrent requests
// reach it, as several hundred would reach the default.
func TestAdv10IdleCapLosesNoSentFrame(t *testing.T) {
	u := newAdv10Upstream(t, false, func(c net.Conn, br *bufio.Reader, req *http.Request, conn, n int) bool {
		if req.URL.Path == "/warm" {
			// Long enough for the warm-up's requests to overlap.
			time.Sleep(50 * time.Millisecond)
		}
		k, _ := io.Copy(io.Discard, req.Body)
		body := fmt.Sprintf("got %d", k)
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		return true
	})
	spec := testSpec
	spec.Path = filepath.Join(t.TempDir(), "seg")
	const conns, rounds, size = 12, 30, 8 << 10
	// Connections stay with the owner, so that every POST goes through it.
	capped := func(tr *Transport) { tr.MaxConnsPerKey = conns }
	opts := NodeOptions{SweepInterval: 50 * time.Millisecond, FixedOwnership: true}
	owner := newMemberOpts(t, spec, opts, capped)
	opts.MaxIdlePeerStreams = 2
	client := newMemberOpts(t, spec, opts, capped)
	owner.node.srv.mu.Lock()
	owner.node.srv.maxIdlePerPeer = 4
	owner.node.srv.mu.Unlock()
	var wg sync.WaitGroup
	for try := 0; try < 5 && owner.node.Stats().OpenConns < conns; try++ {
		for range conns {
			wg.Add(1)
			go func() {
				defer wg.Done()
				req, _ := http.NewRequest("GET", u.url("/warm"), nil)
				if resp, err := owner.tr.RoundTrip(req); err == nil {
					drain(resp)
				}
			}()
		}
		wg.Wait()
	}
	if s := owner.node.Stats(); s.OpenConns != conns {
		t.Fatalf("owner %+v, want all %d connections", s, conns)
	}
	var failed atomic.Int32
	for range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range rounds {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				resp, err := client.tr.RoundTrip(postNoReplay(t, u.url("/post"), size).WithContext(ctx))
				if err != nil {
					if failed.Add(1) <= 3 {
						t.Errorf("POST: %v", err)
					}
				} else {
					if b, err := io.ReadAll(resp.Body); err != nil || string(b) != fmt.Sprintf("got %d", size) {
						t.Errorf("POST: %q %v", b, err)
					}
					resp.Body.Close()
				}
				cancel()
			}
		}()
	}
	wg.Wait()
	var posts int
	for _, r := range u.requests() {
		if strings.HasSuffix(r, "POST /post") {
			posts++
		}
	}
	if n := failed.Load(); n > 0 || posts != conns*rounds {
		t.Errorf("%d of %d POSTs failed; the upstream read %d", n, conns*rounds, posts)
	}
}
