package proxy

import (
	"context"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"
)

// TestAdv71cShutdownIdleLeavesAtOnce: Shutdown's promise that idle
// connections "leave the pool at once, so that nobody picks them", while a
// sibling's exchange on another of the owner's connections keeps the
// Shutdown waiting. Requests a sibling sends meanwhile must find none of
// the owner's connections: the owner refuses no lease as closing (a refusal
// is a lease that picked one), and the requests succeed.
func TestAdv71cShutdownIdleLeavesAtOnce(t *testing.T) {
	u := newTestUpstream(t)
	owner, client := remotePair(t, func(tr *Transport) { tr.MaxConnsPerKey = 3 })
	// The owner makes two connections of the key.
	var wg sync.WaitGroup
	g := u.gate("warm2")
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := get(t, context.Background(), owner.tr, u.url("/stream?id=warm2"))
			if err == nil {
				drain(r)
			}
		}()
	}
	waitFor(t, 3*time.Second, "two owner connections", func() bool { return owner.node.Stats().OpenConns == 2 })
	for range 4 {
		g <- struct{}{}
	}
	wg.Wait()

	hold := u.gate("drainhold")
	defer func() {
		for range 2 {
			select {
			case hold <- struct{}{}:
			default:
			}
		}
	}()
	resp, err := get(t, context.Background(), client.tr, u.url("/stream?id=drainhold"))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if got, err := readWithTimeout(resp.Body, len("chunk-0;"), 5*time.Second); err != nil || got != "chunk-0;" {
		t.Fatalf("first chunk: %q %v", got, err)
	}
	if client.node.Stats().ReusedRemote != 1 {
		t.Fatalf("the held stream did not go through the owner: %+v", client.node.Stats())
	}
	shut := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
		defer cancel()
		shut <- owner.node.Shutdown(ctx)
	}()
	waitFor(t, 2*time.Second, "the owner to drain", func() bool { return owner.node.srv.draining.Load() })
	for i := range 4 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		req, _ := http.NewRequestWithContext(ctx, "GET", u.url("/cl"), nil)
		r, err := client.tr.RoundTrip(req)
		if err != nil {
			cancel()
			t.Fatalf("request %d while the owner drains: %v", i, err)
		}
		b, _ := io.ReadAll(r.Body)
		r.Body.Close()
		cancel()
		if string(b) != "hello world" {
			t.Fatalf("request %d: %q", i, b)
		}
	}
	refused := owner.node.Stats().RefusedBy["closing"]
	hold <- struct{}{}
	hold <- struct{}{}
	drain(resp)
	select {
	case <-shut:
	case <-time.After(8 * time.Second):
		t.Fatal("Shutdown did not return")
	}
	if refused != 0 {
		t.Fatalf("the draining owner refused %d leases as closing: its idle connection was still picked after Shutdown began", refused)
	}
}
