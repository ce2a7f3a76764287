package proxy

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestAdv75bNoDeadlineCallersNeverHang: callers whose requests carry no
// deadline at all (context.Background, as a handler without timeouts has)
// send GETs, POSTs and slow streamed responses through owners that are
// replaced ten times, each old owner leaving with a 20 ms drain or by
// Close. A caller may get an error, but must never hang: every request
// returns within 20s, no POST reaches the upstream twice, no wrong answer,
// none that never reached the upstream fails.
func TestAdv75bNoDeadlineCallersNeverHang(t *testing.T) {
	u := newAdv75bUpstream(t, nil)
	u.delay = func() time.Duration { return 20 * time.Millisecond }
	spec, obs := observedSegment(t)
	conf := func(tr *Transport) { tr.MaxConnsPerKey = 2 }
	join := func() *member {
		m := newMember(t, spec, conf)
		req, _ := http.NewRequest("GET", u.srv.URL+"/?q=own", nil)
		if resp, err := m.tr.RoundTrip(req); err == nil {
			drain(resp)
		}
		return m
	}
	old := join()
	s1 := newMember(t, spec, conf)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var seq, ok atomic.Int64
	var inflight sync.Map // q -> start time
	var mu sync.Mutex
	var fails []string
	for w := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				i := seq.Add(1)
				q := fmt.Sprintf("n%d", i)
				method, body := "GET", ""
				var rb io.Reader
				if i%2 == 0 {
					method, body = "POST", "b"+q
					rb = strings.NewReader(body)
				}
				inflight.Store(q, time.Now())
				req, _ := http.NewRequest(method, u.srv.URL+"/?q="+q, rb)
				resp, err := s1.tr.RoundTrip(req)
				var got []byte
				if err == nil {
					got, err = io.ReadAll(resp.Body)
					resp.Body.Close()
				}
				inflight.Delete(q)
				want := method + ":" + body + ":" + q
				if err == nil && string(got) == want {
					ok.Add(1)
					continue
				}
				mu.Lock()
				if err == nil {
					fails = append(fails, fmt.Sprintf("WRONG %s %s (worker %d): %q", method, q, w, got))
				} else if u.count(q) == 0 {
					fails = append(fails, fmt.Sprintf("[unsent] %s %s (worker %d): %v", method, q, w, err))
				}
				mu.Unlock()
			}
		}()
	}
	for cycle := range 10 {
		time.Sleep(40 * time.Millisecond)
		next := join()
		if cycle%2 == 0 {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
			old.node.Shutdown(ctx)
			cancel()
		} else {
			old.node.Close()
		}
		old.pool.Close()
		old = next
	}
	close(stop)
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		var stuck []string
		inflight.Range(func(k, v any) bool {
			stuck = append(stuck, fmt.Sprintf("%v for %v (upstream saw it %d times)", k, time.Since(v.(time.Time)).Round(time.Millisecond), u.count(k.(string))))
			return true
		})
		t.Fatalf("requests without a deadline hung after their owners left: %v", stuck)
	}
	mu.Lock()
	if len(fails) != 0 {
		t.Errorf("%d requests failed wrongly: %s", len(fails), adv75bFirst(fails, 8))
	}
	mu.Unlock()
	if d := u.dupPosts(); len(d) != 0 {
		t.Errorf("POSTs reached the upstream more than once: %v", d)
	}
	if ok.Load() < 30 {
		t.Errorf("only %d requests succeeded", ok.Load())
	}
	old.node.Close()
	s1.node.Close()
	adv71cTableQuiet(t, obs, 5*time.Second)
}
