package proxy

import (
	"context"
	"errors"
	"io"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/backpressure"
	"github.com/orbitproxy/orbit/governor"
	"github.com/orbitproxy/orbit/orbitpool"
)

func TestLimiterRefusalsAreRetrySafe(t *testing.T) {
	u := newTestUpstream(t)
	lim := backpressure.New(backpressure.WithCap(1))
	tr := localTransport(t, func(tr *Transport) { tr.Limiter = lim })

	// A permit is held for the whole exchange, body included.
	resp, err := get(t, context.Background(), tr, u.url("/chunked"))
	if err != nil {
		t.Fatal(err)
	}
	if lim.Active() != 1 {
		t.Fatalf("%d permits held while the body is unread, want 1", lim.Active())
	}
	drain(resp)
	if lim.Active() != 0 {
		t.Fatalf("%d permits held after the body, want 0", lim.Active())
	}
	// A small body that came with its head is read before the response is
	// returned: the exchange is over.
	resp, err = get(t, context.Background(), tr, u.url("/cl"))
	if err != nil {
		t.Fatal(err)
	}
	if lim.Active() != 0 {
		t.Fatalf("%d permits held while a body read with its head is unread, want 0", lim.Active())
	}
	if b, err := io.ReadAll(resp.Body); err != nil || string(b) != "hello world" {
		t.Fatalf("early body read %q, %v", b, err)
	}
	resp.Body.Close()
	// A response without a body ends its exchange before it is returned.
	resp, err = get(t, context.Background(), tr, u.url("/204"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if lim.Active() != 0 {
		t.Fatalf("%d permits held after a 204, want 0", lim.Active())
	}
	// A retried attempt (the upstream closes the reused connection unanswered)
	// keeps one permit and releases it once.
	warmResp, err := get(t, context.Background(), tr, u.rawURL("/once-per-conn"))
	if err != nil {
		t.Fatal(err)
	}
	drain(warmResp)
	resp, err = get(t, context.Background(), tr, u.rawURL("/once-per-conn"))
	if err != nil {
		t.Fatal(err)
	}
	if lim.Active() != 1 {
		t.Fatalf("%d permits held during a retried exchange, want 1", lim.Active())
	}
	drain(resp)
	if lim.Active() != 0 {
		t.Fatalf("%d permits held after a retried exchange, want 0", lim.Active())
	}

	// A deadline too near to start is refused before anything is sent.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	_, err = get(t, ctx, tr, u.url("/cl"))
	if !errors.Is(err, backpressure.ErrDeadlineNear) || !IsRetrySafe(err) {
		t.Fatalf("error %v, want a retry-safe ErrDeadlineNear", err)
	}
	lim.SetCap(0)
	_, err = get(t, context.Background(), tr, u.url("/cl"))
	if !errors.Is(err, backpressure.ErrQuotaExceeded) {
		t.Fatalf("drained limiter: %v", err)
	}
	if lim.Active() != 0 {
		t.Fatalf("refusals leaked %d permits", lim.Active())
	}
}

func TestResponseHeaderTimeout(t *testing.T) {
	u := newTestUpstream(t)
	paths(t, func(tr *Transport) { tr.ResponseHeaderTimeout = 50 * time.Millisecond }, func(t *testing.T, rt http.RoundTripper, owner *member, _ func() http.RoundTripper) {
		warm(t, owner, u.rawURL("/reason"))
		start := time.Now()
		_, err := get(t, context.Background(), rt, u.rawURL("/stall-head"))
		if !errors.Is(err, ErrResponseHeaderTimeout) {
			t.Fatalf("error %v, want ErrResponseHeaderTimeout", err)
		}
		if d := time.Since(start); d > time.Second {
			t.Fatalf("took %v", d)
		}
	})
}

// TestOwnerGovernorBoundsForwarding: an owner whose governor has one worker
// free runs its siblings' exchanges one at a time, and all of them complete.
func TestOwnerGovernorBoundsForwarding(t *testing.T) {
	u := newTestUpstream(t)
	spec := testSpec
	spec.Path = filepath.Join(t.TempDir(), "seg")
	// Two workers, so that the owner's own two exchanges below run at once
	// (each holds a worker) and make two connections.
	gov := governor.New(2, 0)
	p, err := orbitpool.Open(spec, orbitpool.Options{})
	if err != nil {
		t.Fatal(err)
	}
	nd, err := NewNode(p, NodeOptions{Governor: gov})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nd.Close(); p.Close() })
	owner := &member{pool: p, node: nd, tr: &Transport{Node: nd, MaxConnsPerKey: 2}}
	client := newMember(t, spec, func(tr *Transport) { tr.MaxConnsPerKey = 2 })

	// Two idle connections in the owner.
	done := make(chan struct{}, 2)
	for range 2 {
		go func() {
			warm(t, owner, u.url("/slow?ms=200"))
			done <- struct{}{}
		}()
	}
	<-done
	<-done
	if got := nd.Stats().OpenConns; got != 2 {
		t.Fatalf("owner made %d connections, want 2", got)
	}
	// One worker is taken: the siblings' exchanges share the other.
	held := gov.Acquire()
	defer held.Release()
	start := time.Now()
	for range 2 {
		go func() {
			resp, err := get(t, context.Background(), client.tr, u.url("/slow?ms=100"))
			if err != nil {
				t.Error(err)
			} else {
				drain(resp)
			}
			done <- struct{}{}
		}()
	}
	<-done
	<-done
	if s := client.node.Stats(); s.ReusedRemote != 2 {
		t.Fatalf("%d remote uses, want 2", s.ReusedRemote)
	}
	if d := time.Since(start); d < 200*time.Millisecond {
		t.Fatalf("two 100ms exchanges took %v with one worker: they ran at once", d)
	}
	// The owner releases its worker just after the response's last byte.
	waitFor(t, time.Second, "the owner's workers to be released", func() bool { return gov.Outstanding() == 1 })
}
