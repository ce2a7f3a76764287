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

// TestAdv56StalledInterimReportedOwnerGone: an owner that fails one
// exchange because its sibling read none of a flood of 1xx heads (more than
// the header limit of them queued) must say so: the sibling's caller gets
// that error, not "owner process gone", and the sibling keeps its other
// idle streams to the live owner. Here the caller spends 600 ms in its 1xx
// hook (a slow downstream client) while the upstream sends 5000 103s, more
// than the 64 KiB header limit holds. The first version of the relay closed
// the stream with no error frame: the sibling took the owner for dead and
// dropped every idle stream to it (LOW: a misleading error, and a
// reconnect each).
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
	owner, client := remotePair(t, func(tr *Transport) { h2cConf(tr); tr.MaxResponseHeaderBytes = 64 << 10 })
	if err := getOK(owner, context.Background(), up.url+"/"); err != nil {
		t.Fatal(err)
	}
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
		t.Fatalf("the flood went through (%d): the owner queued more than the header limit of heads the sibling had not read", o.status)
	}
	if !strings.Contains(o.err, errPeerNotReading.Error()) {
		t.Errorf("the caller got %q: want the owner's reason, %q", o.err, errPeerNotReading)
	}
	after := idle()
	gone := strings.Contains(o.err, ErrOwnerGone.Error())
	if gone || after < before-1 {
		t.Errorf("the owner dropped one stalled exchange: the caller got %q (owner process gone: %v), and the sibling's idle streams to the live owner went from %d to %d",
			o.err, gone, before, after)
	}
}
