package proxy

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestAdv75bClientLeavesMidExchange: the member that sent requests through
// the owner's connections is lost (its Node closed, then its pool, or its
// pool first) while one of its responses streams and one of its uploads is
// part-way up. Its callers return (with an error) well within their
// deadlines; the owner's connections do not stay held: a third member's
// requests then all succeed within a short deadline on the capped key,
// and the table is quiet once all have closed.
func TestAdv75bClientLeavesMidExchange(t *testing.T) {
	for _, how := range []string{"node-then-pool", "pool-then-node", "shutdown-short"} {
		t.Run(how, func(t *testing.T) {
			up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				q := r.URL.Query().Get("q")
				switch q {
				case "stream":
					f := w.(http.Flusher)
					for i := 0; i < 100; i++ {
						if _, err := io.WriteString(w, strings.Repeat("s", 1000)); err != nil {
							return
						}
						f.Flush()
						time.Sleep(20 * time.Millisecond)
					}
				case "upload":
					buf := make([]byte, 1024)
					for {
						if _, err := r.Body.Read(buf); err != nil {
							break
						}
						time.Sleep(10 * time.Millisecond)
					}
				}
				io.WriteString(w, "ok"+q)
			}))
			t.Cleanup(up.Close)
			spec, obs := observedSegment(t)
			conf := func(tr *Transport) { tr.MaxConnsPerKey = 2 }
			owner := newMember(t, spec, conf)
			var wg sync.WaitGroup
			for range 2 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					req, _ := http.NewRequest("GET", up.URL+"/?q=stream", nil)
					if resp, err := owner.tr.RoundTrip(req); err == nil {
						drain(resp)
					}
				}()
			}
			wg.Wait()
			client := newMember(t, spec, conf)
			const deadline = 8 * time.Second
			out := make(chan string, 2)
			began := make(chan struct{}, 2)
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), deadline)
				defer cancel()
				start := time.Now()
				req, _ := http.NewRequestWithContext(ctx, "GET", up.URL+"/?q=stream", nil)
				resp, err := client.tr.RoundTrip(req)
				began <- struct{}{}
				if err == nil {
					_, err = io.ReadAll(resp.Body)
					resp.Body.Close()
				}
				out <- fmt.Sprintf("stream %v after %v", err, time.Since(start))
			}()
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), deadline)
				defer cancel()
				start := time.Now()
				pr, pw := io.Pipe()
				go func() {
					for i := 0; i < 200; i++ {
						if _, err := pw.Write(make([]byte, 1024)); err != nil {
							return
						}
						time.Sleep(10 * time.Millisecond)
					}
					pw.Close()
				}()
				defer pr.Close()
				began <- struct{}{}
				req, _ := http.NewRequestWithContext(ctx, "POST", up.URL+"/?q=upload", pr)
				resp, err := client.tr.RoundTrip(req)
				if err == nil {
					_, err = io.ReadAll(resp.Body)
					resp.Body.Close()
				}
				out <- fmt.Sprintf("upload %v after %v", err, time.Since(start))
			}()
			<-began
			<-began
			time.Sleep(300 * time.Millisecond)
			if client.node.Stats().ReusedRemote == 0 {
				t.Errorf("the client's requests did not go through the owner")
			}
			ended := make(chan struct{})
			go func() {
				defer close(ended)
				switch how {
				case "node-then-pool":
					client.node.Close()
					client.pool.Close()
				case "pool-then-node":
					client.pool.Close()
					client.node.Close()
				case "shutdown-short":
					ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
					client.node.Shutdown(ctx)
					cancel()
					client.pool.Close()
				}
			}()
			select {
			case <-ended:
			case <-time.After(15 * time.Second):
				t.Fatal("ending the client hung")
			}
			for range 2 {
				select {
				case s := <-out:
					t.Logf("lost member's caller: %s", s)
				case <-time.After(deadline + 10*time.Second):
					t.Fatal("a caller of the lost member hung past its deadline")
				}
			}
			// The owner's connections come back: a third member's
			// requests all succeed, each within 3s.
			third := newMember(t, spec, conf)
			var fails []string
			var fmu sync.Mutex
			var lw sync.WaitGroup
			for w := range 4 {
				lw.Add(1)
				go func() {
					defer lw.Done()
					for i := range 5 {
						ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
						q := fmt.Sprintf("t%d-%d", w, i)
						req, _ := http.NewRequestWithContext(ctx, "GET", up.URL+"/?q="+q, nil)
						resp, err := third.tr.RoundTrip(req)
						var got []byte
						if err == nil {
							got, err = io.ReadAll(resp.Body)
							resp.Body.Close()
						}
						cancel()
						if err != nil || string(got) != "ok"+q {
							fmu.Lock()
							fails = append(fails, fmt.Sprintf("%s: %q %v", q, got, err))
							fmu.Unlock()
						}
					}
				}()
			}
			lw.Wait()
			if len(fails) != 0 {
				s, _ := obs.Snapshot()
				t.Errorf("%d requests failed after the client member was lost: %v; keys %+v", len(fails), adv75bFirst(fails, 5), s.Keys)
			}
			third.node.Close()
			owner.node.Close()
			adv71cTableQuiet(t, obs, 5*time.Second)
		})
	}
}
