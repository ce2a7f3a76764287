package proxy

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"testing"
	"time"
)

// A sibling's exchange that fails while the owner's writer waits for the
// upstream's 100 (the watch's read pending) halts the stream's reader; the
// watch's read then returns with the halt's deadline, not aborted, and
// bgReader takes the peer for gone, for good (gone is never cleared). The
// stream was left in step (an error frame before the accept), yet the next
// exchange on it, a plain GET from a live sibling, ends it: every exchange
// after the failure pays for a new stream, where the stream should carry
// them all.
func TestAdv63FailedExpectMarksLivePeerGone(t *testing.T) {
	body := bytes.Repeat([]byte("b"), 16<<10)
	url := rawUpstream(t, func(c net.Conn, br *bufio.Reader, req *http.Request) bool {
		if req.URL.Path == "/fail" {
			time.Sleep(30 * time.Millisecond) // the watch's read is pending
			io.WriteString(c, "HTTP/1.1 abc\r\n\r\n")
			return false
		}
		io.Copy(io.Discard, req.Body)
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		return true
	})
	owner, client := remotePair(t, func(tr *Transport) { tr.ExpectContinueTimeout = 5 * time.Second })
	streams := func() map[net.Conn]bool {
		s := owner.node.srv
		s.mu.Lock()
		defer s.mu.Unlock()
		m := make(map[net.Conn]bool)
		for c := range s.conns {
			m[c] = true
		}
		return m
	}
	get := func() {
		t.Helper()
		warm(t, owner, url+"/")
		remote := client.node.Stats().ReusedRemote
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", url+"/", nil)
		resp, err := client.tr.RoundTrip(req)
		if err != nil {
			t.Fatalf("GET: %v", err)
		}
		drain(resp)
		if client.node.Stats().ReusedRemote == remote {
			t.Fatalf("the sibling's GET did not go through the owner")
		}
	}
	get()
	warm(t, owner, url+"/")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	req, _ := http.NewRequestWithContext(ctx, "POST", url+"/fail", bytes.NewReader(body))
	req.Header.Set("Expect", "100-continue")
	if resp, err := client.tr.RoundTrip(req); err == nil {
		resp.Body.Close()
		cancel()
		t.Fatal("POST /fail succeeded")
	}
	cancel()
	before := streams()
	if len(before) != 1 {
		t.Fatalf("%d streams open on the owner after the failed POST; want the one stream, in step", len(before))
	}
	for i := 0; i < 3; i++ {
		get()
		time.Sleep(20 * time.Millisecond) // lets the owner close a stream it counts out of step
		now := streams()
		for c := range before {
			if !now[c] {
				t.Fatalf("GET %d after the failed Expect POST: the owner closed the stream that carried it (%d open now); the sibling is alive and the stream was in step", i, len(now))
			}
		}
	}
}
