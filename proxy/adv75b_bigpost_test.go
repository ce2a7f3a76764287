package proxy

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestAdv75bOwnerEndsMidBodyReplayable: siblings' POSTs with replayable
// bodies (strings.Reader: GetBody set, as net/http sets it) of 2 MiB go
// through the owner's connections to an upstream that reads them slowly, so
// each is part-way up when the owner ends (Shutdown with a 50 ms drain, or
// Close). A POST part of whose body reached the upstream must not be sent
// again, GetBody or not (net/http does not replay a POST once written): the
// upstream sees each POST's head at most once; and every caller returns by
// its deadline.
func TestAdv75bOwnerEndsMidBodyReplayable(t *testing.T) {
	for _, how := range []string{"short", "close"} {
		t.Run(how, func(t *testing.T) {
			u := newAdv75bUpstream(t, nil)
			u.slowRead = 2 * time.Millisecond
			owner, client := newFleetN(t, 2, func(tr *Transport) { tr.MaxConnsPerKey = 3 })
			var wg sync.WaitGroup
			for range 3 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					req, _ := http.NewRequest("GET", u.srv.URL+"/?q=warm", strings.NewReader(""))
					req.Body = nil
					if resp, err := owner.tr.RoundTrip(req); err == nil {
						drain(resp)
					}
				}()
			}
			wg.Wait()
			const n = 3
			const deadline = 8 * time.Second
			out := make(chan error, n)
			for i := range n {
				go func() {
					ctx, cancel := context.WithTimeout(context.Background(), deadline)
					defer cancel()
					body := strings.Repeat("z", 2<<20)
					req, _ := http.NewRequestWithContext(ctx, "POST", fmt.Sprintf("%s/?q=big%d", u.srv.URL, i), strings.NewReader(body))
					start := time.Now()
					resp, err := client.tr.RoundTrip(req)
					if err == nil {
						_, err = io.ReadAll(resp.Body)
						resp.Body.Close()
					}
					if d := time.Since(start); d > deadline+5*time.Second {
						err = fmt.Errorf("returned after %v", d)
						t.Errorf("big%d: %v", i, err)
					}
					out <- err
				}()
			}
			waitFor(t, 5*time.Second, "the POSTs to reach the upstream", func() bool {
				return u.count("big0")+u.count("big1")+u.count("big2") == n
			})
			time.Sleep(100 * time.Millisecond)
			if how == "short" {
				ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
				owner.node.Shutdown(ctx)
				cancel()
			} else {
				owner.node.Close()
			}
			for range n {
				select {
				case <-out:
				case <-time.After(deadline + 10*time.Second):
					t.Fatal("a POST hung")
				}
			}
			if d := u.dupPosts(); len(d) != 0 {
				t.Errorf("POSTs reached the upstream more than once: %v", d)
			}
			if client.node.Stats().ReusedRemote == 0 {
				t.Errorf("no POST went through the owner")
			}
		})
	}
}
