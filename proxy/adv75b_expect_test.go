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

// TestAdv75bShutdownWith100ContinuePending: siblings' POSTs with Expect:
// 100-continue are on the owner's connections, their heads at the
// upstream, which holds its 100 (it has not read the bodies) when the owner
// begins Shutdown. With time to spare, the upstream then reads the bodies
// and answers: every POST succeeds with its own answer, its head and body
// at the upstream once. With a 100 ms drain (the upstream answers only
// after Shutdown returned) a POST may fail, but none reaches the upstream
// twice (head or body) and none waits past its deadline.
func TestAdv75bShutdownWith100ContinuePending(t *testing.T) {
	for _, proto := range []string{"h1", "h2c"} {
		for _, short := range []bool{false, true} {
			t.Run(proto+"/"+map[bool]string{false: "spare", true: "short"}[short], func(t *testing.T) { adv75bExpect(t, proto, short) })
		}
	}
}

func adv75bExpect(t *testing.T, proto string, short bool) {
	{
		{
			gate := make(chan struct{})
			var once sync.Once
			open := func() { once.Do(func() { close(gate) }) }
			t.Cleanup(open)
			var mu sync.Mutex
			heads, bodies := map[string]int{}, map[string]int{}
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				q := r.URL.Query().Get("q")
				mu.Lock()
				heads[q]++
				mu.Unlock()
				if q != "warm" {
					select {
					case <-gate:
					case <-r.Context().Done():
						return
					}
				}
				b, err := io.ReadAll(r.Body)
				if err != nil {
					return
				}
				mu.Lock()
				bodies[q]++
				mu.Unlock()
				io.WriteString(w, q+":"+string(b))
			})
			url := ""
			if proto == "h2c" {
				url = newH2CServer(t, h).url
			} else {
				up := httptest.NewServer(h)
				t.Cleanup(up.Close)
				url = up.URL
			}
			owner, client := newFleetN(t, 2, func(tr *Transport) {
				tr.MaxConnsPerKey = 3
				tr.ExpectContinueTimeout = 30 * time.Second
				tr.H2C = proto == "h2c"
			})
			var wg sync.WaitGroup
			for range 3 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					req, _ := http.NewRequest("GET", url+"/?q=warm", nil)
					if resp, err := owner.tr.RoundTrip(req); err == nil {
						drain(resp)
					}
				}()
			}
			wg.Wait()
			const n = 3
			const deadline = 8 * time.Second
			type res struct {
				q, got string
				err    error
				d      time.Duration
			}
			out := make(chan res, n)
			for i := range n {
				go func() {
					q := fmt.Sprintf("e%d", i)
					body := strings.Repeat("y", 100<<10)
					ctx, cancel := context.WithTimeout(context.Background(), deadline)
					defer cancel()
					req, _ := http.NewRequestWithContext(ctx, "POST", url+"/?q="+q, strings.NewReader(body))
					req.Header.Set("Expect", "100-continue")
					start := time.Now()
					resp, err := client.tr.RoundTrip(req)
					var got []byte
					if err == nil {
						got, err = io.ReadAll(resp.Body)
						resp.Body.Close()
					}
					out <- res{q, string(got), err, time.Since(start)}
				}()
			}
			waitFor(t, 5*time.Second, "the heads to reach the upstream", func() bool {
				mu.Lock()
				defer mu.Unlock()
				return heads["e0"]+heads["e1"]+heads["e2"] == n
			})
			drainFor := 10 * time.Second
			if short {
				drainFor = 100 * time.Millisecond
			}
			shut := make(chan struct{})
			go func() {
				defer close(shut)
				ctx, cancel := context.WithTimeout(context.Background(), drainFor)
				defer cancel()
				owner.node.Shutdown(ctx)
			}()
			if short {
				select {
				case <-shut:
				case <-time.After(15 * time.Second):
					t.Fatal("Shutdown hung")
				}
			}
			time.Sleep(100 * time.Millisecond)
			open()
			for range n {
				select {
				case r := <-out:
					want := r.q + ":" + strings.Repeat("y", 100<<10)
					if r.err == nil && r.got != want {
						t.Errorf("%s: wrong answer (%d bytes)", r.q, len(r.got))
					}
					if !short && r.err != nil {
						t.Errorf("%s failed though Shutdown had time to spare: %v", r.q, r.err)
					}
					if r.d > deadline+5*time.Second {
						t.Errorf("%s returned after %v", r.q, r.d)
					}
				case <-time.After(deadline + 10*time.Second):
					t.Fatal("a POST hung past its deadline")
				}
			}
			<-shut
			if client.node.Stats().ReusedRemote == 0 {
				t.Errorf("no POST went through the owner")
			}
			mu.Lock()
			defer mu.Unlock()
			for i := range n {
				q := fmt.Sprintf("e%d", i)
				if heads[q] != 1 || bodies[q] > 1 {
					t.Errorf("POST %s reached the upstream %d times (body read %d times)", q, heads[q], bodies[q])
				}
			}
		}
	}
}
