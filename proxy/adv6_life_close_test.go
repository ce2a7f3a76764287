package proxy

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
)

// TestAdv6LifeSecondCloseWaits: a Close (or Shutdown) made while another is
// under way must not return before that one has finished: its caller closes
// the pool next (the Caddy module's Destruct does), under a node still
// retiring its connections, whose units would then never go back. The first
// Close is held in its wait for a peer stream (paused between exchanges).
func TestAdv6LifeSecondCloseWaits(t *testing.T) {
	for _, second := range []string{"Close", "Shutdown"} {
		t.Run(second, func(t *testing.T) {
			u := newHangUpstream(t)
			close(u.release)
			owner, client := remotePair(t, nil)
			warm(t, owner, u.srv.URL+"/warm")

			var armed atomic.Bool
			paused, resume := make(chan struct{}), make(chan struct{})
			hook := func() {
				if armed.CompareAndSwap(true, false) {
					paused <- struct{}{}
					<-resume
				}
			}
			betweenExchanges.Store(&hook)
			t.Cleanup(func() { betweenExchanges.Store(nil) })
			resumed := false
			defer func() {
				if !resumed {
					close(resume)
				}
			}()
			armed.Store(true)
			if r := <-sendAsync(client.tr, postOnce(u.srv.URL+"/hang", "one")); r.err != nil || r.body != "ok" {
				t.Fatalf("POST through the owner: %q, %v", r.body, r.err)
			}
			select {
			case <-paused:
			case <-time.After(5 * time.Second):
				t.Fatal("the owner's stream did not finish its exchange")
			}
			first := make(chan struct{})
			go func() { owner.node.Close(); close(first) }()
			waitFor(t, 2*time.Second, "the first Close to close the server", func() bool {
				owner.node.srv.mu.Lock()
				defer owner.node.srv.mu.Unlock()
				return owner.node.srv.closed
			})
			open := make(chan int, 1)
			go func() {
				if second == "Close" {
					owner.node.Close()
				} else {
					ctx, cancel := context.WithTimeout(context.Background(), time.Second)
					owner.node.Shutdown(ctx)
					cancel()
				}
				open <- owner.node.Stats().OpenConns
			}()
			var early = -1
			select {
			case early = <-open:
			case <-time.After(100 * time.Millisecond):
			}
			close(resume)
			resumed = true
			select {
			case <-first:
			case <-time.After(5 * time.Second):
				t.Fatal("the first Close hung")
			}
			if early >= 0 {
				t.Fatalf("a second %s returned while the first Close was under way, with %d connections still open", second, early)
			}
			select {
			case n := <-open:
				if n != 0 {
					t.Fatalf("the second %s returned with %d connections still open", second, n)
				}
			case <-time.After(5 * time.Second):
				t.Fatalf("the second %s hung", second)
			}
		})
	}
}
