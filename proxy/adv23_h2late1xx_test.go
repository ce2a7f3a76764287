package proxy

import (
	"bufio"
	"bytes"
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
	"golang.org/x/net/http2/hpack"
)

// TestAdv23H2Late1xxAfterErrorFrame: a sibling's streaming request (body
// held back until the accept) runs on the owner's HTTP/2 connection, whose
// upstream has stopped reading, so x/net's writer is stuck in the head's
// write and the stream stays in the ClientConn's table. The owner cancels
// the exchange at the sibling's deadline and sends the error frame; the
// stream is kept for the next exchange. The upstream then sends a 103 for
// that stream: x/net's read loop finds the stream still there and calls the
// exchange's Got1xxResponse, and the relay writes an accept and the 103 onto
// the unix stream after the error frame, where the sibling would read them
// as the next exchange's answer (and from a goroutine other than the one
// that serves the stream).
func TestAdv23H2Late1xxAfterErrorFrame(t *testing.T) {
	release := make(chan struct{})
	var once sync.Once
	unblock := func() { once.Do(func() { close(release) }) }
	defer unblock()
	send1xx := make(chan struct{})
	sent1xx := make(chan error, 1)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	serveConns(t, ln, func(c net.Conn, _ int) {
		serveH2Frames(c, []http2.Setting{{ID: http2.SettingMaxConcurrentStreams, Val: 100}},
			func(fr *http2.Framer, hf *http2.HeadersFrame) {
				go func() {
					select {
					case <-send1xx:
					case <-release:
						return
					}
					var hb bytes.Buffer
					enc := hpack.NewEncoder(&hb)
					enc.WriteField(hpack.HeaderField{Name: ":status", Value: "103"})
					enc.WriteField(hpack.HeaderField{Name: "link", Value: "</late.css>; rel=preload"})
					// The sibling's stream is the next after the first.
					sent1xx <- fr.WriteHeaders(http2.HeadersFrameParam{StreamID: hf.StreamID + 2, BlockFragment: hb.Bytes(), EndHeaders: true})
				}()
				<-release
				for {
					if _, err := fr.ReadFrame(); err != nil {
						return
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
	big := strings.Repeat("a", 8<<20)
	host := strings.TrimPrefix(url, "http://")
	go io.WriteString(sc, string(frame)+"POST /body HTTP/1.1\r\nHost: "+host+"\r\nX-Big: "+big+"\r\nTransfer-Encoding: chunked\r\n\r\n")
	br := bufio.NewReader(sc)
	f, err := readFrame(br, respHeaderLen, decodeResponseFrame)
	if err != nil {
		t.Fatalf("no answer to the exchange: %v", err)
	}
	if f.typ != frameError {
		t.Fatalf("frame %d (%s), want the error frame of a cancelled exchange", f.typ, f.msg)
	}

	close(send1xx)
	select {
	case err := <-sent1xx:
		if err != nil {
			t.Fatalf("the upstream could not send its 103: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the upstream did not send its 103")
	}
	sc.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
	b := make([]byte, 256)
	if n, err := br.Read(b); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the stream carried %d more bytes (%q, %v) after the failed exchange's error frame: a late 1xx was relayed onto a stream kept for the next exchange", n, b[:n], err)
	}
}
