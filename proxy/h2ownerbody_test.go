package proxy

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/orbitpool"
	"golang.org/x/net/http2"
)

// TestH2SiblingBodyNotReadAfterFailedExchange: a sibling's streaming request
// (its body held back until the accept) runs on the owner's HTTP/2
// connection, whose upstream has stopped reading, so the owner's write of
// the request's (large) head blocks. The owner cancels the exchange at the
// sibling's deadline: x/net returns from RoundTrip once the body is closed,
// while its writer is still in the head's write, and the owner tells the
// sibling with an error frame. The stream stays open for the next exchange.
// When the upstream reads again, the write ends, and the writer goes on to
// the body: it must not send an accept onto the stream, nor read the next
// exchange's bytes as this one's body.
func TestH2SiblingBodyNotReadAfterFailedExchange(t *testing.T) {
	release := make(chan struct{})
	var once sync.Once
	unblock := func() { once.Do(func() { close(release) }) }
	defer unblock() // before the members' cleanup: the write ends with it
	headRead := make(chan struct{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	serveConns(t, ln, func(c net.Conn, _ int) {
		serveH2Frames(c, []http2.Setting{{ID: http2.SettingMaxConcurrentStreams, Val: 100}},
			func(fr *http2.Framer, _ *http2.HeadersFrame) {
				// The first stream stops the connection's reads until
				// release; then everything is read and nothing answered.
				<-release
				for {
					f, err := fr.ReadFrame()
					if err != nil {
						return
					}
					if c, ok := f.(*http2.ContinuationFrame); ok && c.HeadersEnded() {
						close(headRead)
					}
				}
			})
	})
	url := "http://" + ln.Addr().String()
	owner, client := remotePair(t, func(tr *Transport) {
		tr.H2C = true
		tr.MaxConnsPerKey = 2
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		req, _ := http.NewRequestWithContext(ctx, "GET", url+"/block", nil)
		if resp, err := owner.tr.RoundTrip(req); err == nil {
			resp.Body.Close()
		}
	}()
	key := mustKey(t, owner.tr, url)
	waitFor(t, 5*time.Second, "the owner's connection, with the first stream on it", func() bool {
		c, _ := owner.pool.Candidates(key, nil)
		return len(c) == 1 && c[0].InUse == 1
	})

	actx, acancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer acancel()
	plan, err := client.pool.Acquire(actx, key, orbitpool.LocalFirst{}, orbitpool.Limits{MaxResources: 2})
	if err != nil || plan.Kind != orbitpool.PlanReuseRemote {
		t.Fatalf("plan %+v %v, want a lease on the owner's connection", plan, err)
	}
	lb, _ := plan.Lease.AppendBinary(nil)
	frame, err := appendRequestFrame(nil, lb, time.Now().Add(3*time.Second), flagBodyOnAccept)
	if err != nil {
		t.Fatal(err)
	}
	sc, err := net.Dial("unix", SocketPath(SocketDir(owner.pool.Spec().Path), owner.pool.Lane()))
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	sc.SetDeadline(time.Now().Add(20 * time.Second))
	// Far more head than the socket buffers between owner and upstream
	// hold, and within the owner's limit on a sibling's head (10 MiB).
	big := strings.Repeat("a", 8<<20)
	host := strings.TrimPrefix(url, "http://")
	io.WriteString(sc, string(frame)+"POST /body HTTP/1.1\r\nHost: "+host+"\r\nX-Big: "+big+"\r\nTransfer-Encoding: chunked\r\n\r\n")
	br := bufio.NewReader(sc)
	f, err := readFrame(br, respHeaderLen, decodeResponseFrame)
	if err != nil {
		t.Fatalf("no answer to the exchange: %v", err)
	}
	if f.typ != frameError {
		t.Fatalf("frame %d (%s), want the error frame of a cancelled exchange: the head's write did not block, and the test shows nothing", f.typ, f.msg)
	}

	unblock()
	select {
	case <-headRead:
	case <-time.After(10 * time.Second):
		t.Fatal("the upstream did not get the head once it read again")
	}
	sc.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
	if n, err := br.Read(make([]byte, 64)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the stream carried %d more bytes (%v) after the failed exchange's error frame: its writer went on with the body", n, err)
	}
}
