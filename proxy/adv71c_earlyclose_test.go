package proxy

import (
	"context"
	"io"
	"sync"
	"testing"
	"time"
)

// TestAdv71cSiblingClosesBodyEarlyConnNotReusedWithLeftover: a sibling
// closes a response body it has read only part of, through its owner, while
// the upstream still has the rest to send (it sends it after the close).
// The owner's connection must not carry the rest into the next exchange:
// every later request, the owner's and the sibling's, reads its own answer.
func TestAdv71cSiblingClosesBodyEarlyConnNotReusedWithLeftover(t *testing.T) {
	for _, kind := range []string{"cl", "bigcl", "chunked", "cd"} {
		t.Run(kind, func(t *testing.T) {
			started := make(chan string, 1)
			release := make(chan struct{})
			var once sync.Once
			rel := func() { once.Do(func() { close(release) }) }
			defer rel()
			base := adv71cHeldBody(t, started, release)
			owner, client := remotePair(t, nil)
			warm(t, owner, base+"/warm")
			resp, err := get(t, context.Background(), client.tr, base+"/body?kind="+kind)
			if err != nil {
				t.Fatal(err)
			}
			if got, err := readWithTimeout(resp.Body, len("part-one;"), 5*time.Second); err != nil || got != "part-one;" {
				resp.Body.Close()
				t.Fatalf("first part: %q %v", got, err)
			}
			resp.Body.Close()
			rel()
			time.Sleep(50 * time.Millisecond)
			for i := range 4 {
				m := owner
				if i%2 == 1 {
					m = client
				}
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				r, err := get(t, ctx, m.tr, base+"/warm")
				if err != nil {
					cancel()
					t.Fatalf("request %d after the early close: %v", i, err)
				}
				b, err := io.ReadAll(r.Body)
				r.Body.Close()
				cancel()
				if err != nil || string(b) != "ok" {
					t.Fatalf("request %d after the early close read %q %v (status %d), want its own answer", i, b, err, r.StatusCode)
				}
			}
			if n := owner.node.Stats().OpenConns + client.node.Stats().OpenConns; n > 1 {
				t.Fatalf("%d connections open with a cap of 1", n)
			}
		})
	}
}
