package proxy

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// advRefusedUpstream is a plain upstream with no cap of its own: it closes
// a connection when the client does. /stream answers an endless chunked
// stream (an SSE feed, say) until its write fails; /drop* closes the
// connection without an answer (a "return 444" rule, a blocked client);
// /slowdrop does so after working on the request for 500ms.
type advRefusedUpstream struct {
	url      string
	conns    atomic.Int64
	requests sync.Map // path -> *atomic.Int64
}

func (u *advRefusedUpstream) count(path string) int64 {
	v, _ := u.requests.LoadOrStore(path, new(atomic.Int64))
	return v.(*atomic.Int64).Load()
}

func startAdvRefusedUpstream(t *testing.T) *advRefusedUpstream {
	t.Helper()
	u := &advRefusedUpstream{}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var all []net.Conn
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range all {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u.conns.Add(1)
			mu.Lock()
			all = append(all, c)
			mu.Unlock()
			wg.Go(func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					v, _ := u.requests.LoadOrStore(req.URL.Path, new(atomic.Int64))
					v.(*atomic.Int64).Add(1)
					if strings.HasPrefix(req.URL.Path, "/drop") {
						return
					}
					if strings.HasPrefix(req.URL.Path, "/slowdrop") {
						io.Copy(io.Discard, req.Body)
						time.Sleep(500 * time.Millisecond)
						return
					}
					if req.URL.Path == "/stream" {
						io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
						chunk := "1000\r\n" + strings.Repeat("x", 4096) + "\r\n"
						for {
							if _, err := io.WriteString(c, chunk); err != nil {
								return
							}
							time.Sleep(200 * time.Microsecond)
						}
					}
					io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
				}
			})
		}
	})
	u.url = "http://" + ln.Addr().String()
	return u
}

// advCancelStream opens /stream, reads some of it and gives up, as a client
// that navigates away from an SSE feed.
func advCancelStream(t *testing.T, tr http.RoundTripper, url string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", url+"/stream", nil)
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatalf("stream: %v", err)
	}
	if _, err := io.CopyN(io.Discard, resp.Body, 64<<10); err != nil {
		t.Fatalf("stream body: %v", err)
	}
	resp.Body.Close()
}

// TestAdvRefusedResetStreamDoesNotHoldTheCap: an upstream without a cap
// of its own, a fleet cap of 1. A client that gives up an endless stream
// leaves a failed connection; the upstream sends more than maxCloseDrain
// after the half-close, so closeAfterPeer resets the connection (the
// upstream lets it go at once) and then keeps its unit for the rest of
// failedWait (300ms here): the next GET, with 3s to live, is served. Once
// the upstream is known to enforce its cap (keyCap.enforcing), a failed
// connection waits up to maxRefusedHold for the upstream's close; a reset
// must not make it wait that long for nothing: the next GET is served as
// before.
func TestAdvRefusedResetStreamDoesNotHoldTheCap(t *testing.T) {
	up := startAdvRefusedUpstream(t)
	spec := testSpec
	spec.Path = filepath.Join(t.TempDir(), "seg")
	m := newMemberOpts(t, spec, NodeOptions{SweepInterval: 50 * time.Millisecond, FailedCloseWait: 300 * time.Millisecond},
		func(tr *Transport) { tr.MaxConnsPerKey = 1 })

	get := func(what string) {
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		if err := getBody(ctx, m.tr, up.url+"/ok"); err != nil {
			t.Errorf("%s: GET after a given-up stream failed after %v: %v", what, time.Since(start).Round(time.Millisecond), err)
		}
	}

	advCancelStream(t, m.tr, up.url)
	get("not enforcing")

	m.node.capOf(m.tr.last.Load().key).refusedAt.Store(sinceStart(time.Now()))
	advCancelStream(t, m.tr, up.url)
	get("enforcing")
}
