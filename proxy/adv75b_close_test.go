package proxy

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"
)

// TestAdv75bLoseOwnerUnderLoad: a member that owns connections is lost
// while two stable members send mixed GET/POST load through it, in each of
// several ways: its pool Closed then its Node shut down; Shutdown and Close
// racing; two Closes racing; pool Close racing Shutdown. Property: the
// ending returns in bounded time; no request that never reached the
// upstream fails (it was safe to send elsewhere); no request gets another's
// answer; no POST reaches the upstream twice; no caller waits past its own
// deadline; and the table is quiet once all have closed.
func TestAdv75bLoseOwnerUnderLoad(t *testing.T) {
	ways := map[string]func(m *member){
		"poolclose-then-shutdown": func(m *member) {
			m.pool.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			m.node.Shutdown(ctx)
		},
		"shutdown-vs-close": func(m *member) {
			var wg sync.WaitGroup
			wg.Add(2)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				m.node.Shutdown(ctx)
			}()
			go func() { defer wg.Done(); time.Sleep(20 * time.Millisecond); m.node.Close() }()
			wg.Wait()
			m.pool.Close()
		},
		"close-vs-close": func(m *member) {
			var wg sync.WaitGroup
			wg.Add(2)
			go func() { defer wg.Done(); m.node.Close() }()
			go func() { defer wg.Done(); m.node.Close() }()
			wg.Wait()
			m.pool.Close()
		},
		"shutdown-vs-poolclose": func(m *member) {
			var wg sync.WaitGroup
			wg.Add(2)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				m.node.Shutdown(ctx)
			}()
			go func() { defer wg.Done(); time.Sleep(10 * time.Millisecond); m.pool.Close() }()
			wg.Wait()
		},
	}
	for name, end := range ways {
		t.Run(name, func(t *testing.T) {
			u := newAdv75bUpstream(t, nil)
			u.delay = func() time.Duration { return 2 * time.Millisecond }
			spec, obs := observedSegment(t)
			conf := func(tr *Transport) { tr.MaxConnsPerKey = 2 }
			owner := newMember(t, spec, conf)
			var wg sync.WaitGroup
			for range 2 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					req, _ := http.NewRequest("GET", u.srv.URL+"/?q=warm", nil)
					if resp, err := owner.tr.RoundTrip(req); err == nil {
						drain(resp)
					}
				}()
			}
			wg.Wait()
			s1 := newMember(t, spec, conf)
			s2 := newMember(t, spec, conf)
			load := startAdv75bLoad(t, u, "c", 6*time.Second, map[*member]int{s1: 4, s2: 4})
			time.Sleep(150 * time.Millisecond)
			done := make(chan struct{})
			go func() { defer close(done); end(owner) }()
			select {
			case <-done:
			case <-time.After(15 * time.Second):
				load.stop()
				t.Fatal("ending the owner hung")
			}
			time.Sleep(300 * time.Millisecond)
			load.stop()
			all, unsent, wrong := load.failures()
			if unsent != 0 || wrong != 0 {
				t.Errorf("%d of %d requests failed that never reached the upstream, %d got a wrong answer: %s",
					unsent, load.sent.Load(), wrong, adv75bFirst(all, 8))
			}
			if d := u.dupPosts(); len(d) != 0 {
				t.Errorf("POSTs reached the upstream more than once: %v", d)
			}
			if n := load.slow.Load(); n != 0 {
				t.Errorf("%d requests returned well after their own deadline", n)
			}
			if load.ok.Load() < 50 {
				t.Errorf("only %d requests succeeded", load.ok.Load())
			}
			if s1.node.Stats().ReusedRemote+s2.node.Stats().ReusedRemote == 0 {
				t.Errorf("no request used the owner's connections")
			}
			s1.node.Close()
			s2.node.Close()
			owner.node.Close()
			adv71cTableQuiet(t, obs, 5*time.Second)
		})
	}
}
