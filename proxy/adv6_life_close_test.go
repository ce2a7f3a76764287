package proxy

import (
	"context"
	"io"
	"net/http"
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
			po := pauseOwnerAfterPOST(t)
			owner := po.owner
			first := make(chan struct{})
			go func() { owner.node.Close(); close(first) }()
			waitServerClosed(t, owner)
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
			po.resume()
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

// TestAdv6LifeCloseBoundedWithHangingUpstream: Close, and Shutdown whose
// drain times out, return in bounded time while a sibling's exchange waits
// on an upstream that never answers, for a request with no deadline (the
// owner's watcher then has none to enforce): closing the stream must end the
// exchange rather than wait for the upstream. A hanging request was sent
// upstream: the sibling must not send it again.
func TestAdv6LifeCloseBoundedWithHangingUpstream(t *testing.T) {
	for _, how := range []string{"Close", "Shutdown"} {
		for _, method := range []string{"GET", "POST"} {
			t.Run(how+"/"+method, func(t *testing.T) {
				u := newHangUpstream(t)
				owner, client := remotePair(t, nil)
				func() {
					req, _ := http.NewRequest("GET", u.srv.URL+"/warm", nil)
					resp, err := owner.tr.RoundTrip(req)
					if err != nil {
						t.Fatal(err)
					}
					drain(resp)
				}()
				req, _ := http.NewRequest(method, u.srv.URL+"/hang", nil)
				if method == "POST" {
					req = postOnce(u.srv.URL+"/hang", "once")
				}
				done := make(chan error, 1)
				go func() {
					resp, err := client.tr.RoundTrip(req) // no deadline
					if err == nil {
						_, err = io.ReadAll(resp.Body)
						resp.Body.Close()
					}
					done <- err
				}()
				select {
				case <-u.arrived:
				case <-time.After(5 * time.Second):
					t.Fatal("the request never reached the upstream")
				}
				start := time.Now()
				closed := make(chan struct{})
				go func() {
					if how == "Close" {
						owner.node.Close()
					} else {
						ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
						owner.node.Shutdown(ctx)
						cancel()
					}
					close(closed)
				}()
				select {
				case <-closed:
				case <-time.After(2 * time.Second):
					close(u.release)
					<-closed
					t.Fatalf("%s waited on the upstream (%s) with a sibling's exchange outstanding", how, time.Since(start))
				}
				if method == "GET" {
					// Replayable: the sibling sends it again, on a
					// connection of its own, where it hangs as well.
					close(u.release)
				}
				var err error
				select {
				case err = <-done:
				case <-time.After(2 * time.Second):
					if method == "POST" {
						close(u.release)
					}
					t.Fatal("the sibling's request did not end when its owner closed")
				}
				if method == "GET" {
					if err != nil {
						t.Fatalf("a GET whose owner closed before any answer was not sent again: %v", err)
					}
					return
				}
				if err == nil {
					t.Fatal("a POST whose owner closed under it succeeded")
				}
				if n := u.count("POST once"); n != 1 {
					t.Fatalf("the upstream saw the POST %d times", n)
				}
			})
		}
	}
}
