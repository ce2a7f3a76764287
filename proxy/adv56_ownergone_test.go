package proxy

import (
	"context"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestAdv56StalledInterimReportedOwnerGone: when relay1xxNoWait finds no
// room for a 1xx, the owner fails that one exchange on purpose and closes
// the unix stream "without an error frame". The sibling cannot tell that
// from the owner process dying: its RoundTrip returns ErrOwnerGone ("owner
// process gone: unexpected EOF"), and the transport acts on it as on a dead
// sibling (transport.go: peers.dropLane closes every idle stream to the
// owner, and the pool is reconciled). Here the sibling's caller spends
// 600 ms in its 1xx hook (a slow downstream client) while the upstream
// sends a run of 103s; the owner, alive and well, drops the exchange. The
// caller is told the owner process is gone, and the sibling's two other
// idle streams to that owner, which had nothing to do with it, are closed.
// An owner that decides to drop one exchange must say so (an error frame
// before the stream ends is impossible mid-head, but the next exchange's
// streams need not pay, and the caller's error should not claim a dead
// process).
//
// Severity LOW: a misleading error and lost idle streams (a reconnect
// each, and a pool reconcile) for a live owner, whenever a slow client
// meets a burst of 1xx; no data is lost or replayed.
func TestAdv56StalledInterimReportedOwnerGone(t *testing.T) {
	up := newRawH2(t, func(s *rawStream) {
		switch s.path {
		case "/flood":
			for range 5000 {
				s.headers(false, ":status", "103", "link", "</style.css>; rel=preload; as=style")
			}
		case "/slow":
			time.Sleep(150 * time.Millisecond)
		}
		s.headers(false, ":status", "200", "content-length", "2")
		s.data(true, []byte("ok"))
	})
	_, client := h2Pair(t, up.url)
	// Three idle streams from the sibling to the owner.
	var wg sync.WaitGroup
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			if err := getOK(client, ctx, up.url+"/slow"); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	idle := func() int {
		client.node.peers.mu.Lock()
		defer client.node.peers.mu.Unlock()
		n := 0
		for _, l := range client.node.peers.idle {
			n += len(l)
		}
		return n
	}
	before := idle()
	if before < 2 {
		t.Fatalf("%d idle streams to the owner after three concurrent requests; want 3", before)
	}

	first := true
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{Got1xxResponse: func(int, textproto.MIMEHeader) error {
		if first {
			first = false
			time.Sleep(600 * time.Millisecond) // a slow downstream client
		}
		return nil
	}})
	req, _ := http.NewRequestWithContext(ctx, "GET", up.url+"/flood", nil)
	o := roundTripOutcome(client.tr, req)
	if o.err == "" {
		t.Skipf("the flood went through (%d): the owner found room for every 103", o.status)
	}
	after := idle()
	gone := strings.Contains(o.err, ErrOwnerGone.Error())
	if gone || after < before-1 {
		t.Errorf("the owner dropped one stalled exchange: the caller got %q (owner process gone: %v), and the sibling's idle streams to the live owner went from %d to %d",
			o.err, gone, before, after)
	}
}
