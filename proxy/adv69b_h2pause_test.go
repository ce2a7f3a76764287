package proxy

import (
	"context"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"
)

// TestAdv69bH2ChosenThenRoom: with the table full, concurrent requests to
// an https upstream offered h2, whose protocol is not known yet, dial it
// outside the table; it chooses h2, and they pause for room instead. Once
// room comes they are all served over HTTP/2 in the table, none fails,
// and the upstream sees a bounded number of connections.
func TestAdv69bH2ChosenThenRoom(t *testing.T) {
	release := make(chan struct{})
	relOnce := sync.OnceFunc(func() { close(release) })
	defer relOnce()
	h1, tc := adv68cTLSH1(t, release)
	h2, dialed := h2TLSUpstream(t, tc)
	m := newMember(t, adv69bSpec, func(tr *Transport) {
		tr.HTTP2 = true
		tr.TLSClientConfig = tc
	})
	held := holdStreams(t, m, h1.URL, 2)
	const N = 6
	var wg sync.WaitGroup
	errs := make(chan error, N)
	protos := make(chan int, N)
	for range N {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, "GET", h2.URL+"/", nil)
			resp, err := m.tr.RoundTrip(req)
			if err != nil {
				errs <- err
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			protos <- resp.ProtoMajor
		}()
	}
	time.Sleep(300 * time.Millisecond)
	relOnce()
	for _, r := range held {
		drain(r)
	}
	wg.Wait()
	close(errs)
	close(protos)
	for err := range errs {
		t.Fatalf("a request that paused for room: %v", err)
	}
	for p := range protos {
		if p != 2 {
			t.Fatalf("served over HTTP/%d; want 2", p)
		}
	}
	if n := dialed.Load(); n > N+1 {
		t.Fatalf("the h2 upstream saw %d connections for %d requests", n, N)
	}
	if s := m.node.Stats(); s.Unpooled != 0 {
		t.Fatalf("stats %+v: a request went unpooled to an h2 upstream", s)
	}
}
