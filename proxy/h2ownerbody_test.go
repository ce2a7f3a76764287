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
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/orbitpool"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// stuckExchange is a sibling's exchange the owner cancelled while its
// HTTP/2 client was still writing the request's head upstream.
type stuckExchange struct {
	// br reads the sibling's end of the unix stream, past the error
	// frame; the stream is open, as it is for the next exchange.
	br *bufio.Reader
	// up writes on the upstream's end of the connection, and stream is
	// the sibling's stream on it.
	up     *http2.Framer
	stream uint32
	// release has the upstream read again: every frame from then on
	// goes to the onFrame given to stuckSiblingExchange.
	release func()
}

// stuckSiblingExchange sends a sibling's streaming request (its body held
// back until the accept) with an 8 MiB head through the owner's HTTP/2
// connection, whose upstream stops reading at the connection's first
// stream: the owner's write of the head blocks, and the owner cancels the
// exchange at the sibling's deadline, which it tells in an error frame.
func stuckSiblingExchange(t *testing.T, onFrame func(http2.Frame)) *stuckExchange {
	t.Helper()
	release := make(chan struct{})
	var once sync.Once
	s := &stuckExchange{release: func() { once.Do(func() { close(release) }) }}
	framer := make(chan *http2.Framer, 1)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	serveConns(t, ln, func(c net.Conn, _ int) {
		serveH2Frames(c, []http2.Setting{{ID: http2.SettingMaxConcurrentStreams, Val: 100}},
			func(fr *http2.Framer, f *http2.HeadersFrame) {
				s.stream = f.StreamID + 2 // the sibling's, the next one
				framer <- fr
				<-release
				for {
					f, err := fr.ReadFrame()
					if err != nil {
						return
					}
					onFrame(f)
				}
			})
	})
	url := "http://" + ln.Addr().String()
	// The owner reads the 8 MiB head before it accepts the lease, which
	// under -race on a loaded machine has taken longer than the default
	// ReservationTimeout: the lease, aged out, was refused as stale.
	spec := testSpec
	spec.Path = filepath.Join(t.TempDir(), "seg")
	popts := orbitpool.Options{ReconcileInterval: 50 * time.Millisecond, ReservationTimeout: time.Minute}
	conf := func(tr *Transport) {
		tr.H2C = true
		tr.MaxConnsPerKey = 2
	}
	owner := newMemberPoolOpts(t, spec, popts, NodeOptions{SweepInterval: 50 * time.Millisecond}, conf)
	client := newMemberPoolOpts(t, spec, popts, NodeOptions{SweepInterval: 50 * time.Millisecond}, conf)
	// Cleanups run last first: the upstream reads again before the
	// members close (the write ends with it) and before the upstream
	// waits for its handlers.
	t.Cleanup(s.release)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
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
	s.up = <-framer

	// The deadline leaves the owner time to read the head under -race on
	// a loaded machine: 3s has been too short for it.
	sc, frame := leasedStream(t, owner, client, key, 2, time.Now().Add(10*time.Second))
	sc.SetDeadline(time.Now().Add(30 * time.Second))
	// Far more head than the socket buffers between owner and upstream
	// hold, and within the owner's limit on a sibling's head (10 MiB).
	big := strings.Repeat("a", 8<<20)
	host := strings.TrimPrefix(url, "http://")
	go io.WriteString(sc, string(frame)+"POST /body HTTP/1.1\r\nHost: "+host+"\r\nX-Big: "+big+"\r\nTransfer-Encoding: chunked\r\n\r\n")
	s.br = bufio.NewReader(sc)
	f, err := readFrame(s.br, respHeaderLen, decodeResponseFrame)
	if err != nil {
		t.Fatalf("no answer to the exchange: %v", err)
	}
	if f.typ != frameError {
		t.Fatalf("frame %d (%s), want the error frame of a cancelled exchange: the head's write did not block, and the test shows nothing", f.typ, f.msg)
	}
	sc.SetReadDeadline(time.Time{})
	return s
}

// assertQuiet fails t if the stream carries anything within 500ms.
func (s *stuckExchange) assertQuiet(t *testing.T, what string) {
	t.Helper()
	done := make(chan struct{})
	var n int
	var err error
	b := make([]byte, 256)
	go func() {
		n, err = s.br.Read(b)
		close(done)
	}()
	select {
	case <-done:
		t.Fatalf("the stream carried %d more bytes (%q, %v) after the failed exchange's error frame: %s", n, b[:n], err, what)
	case <-time.After(500 * time.Millisecond):
	}
}

// TestH2SiblingBodyNotReadAfterFailedExchange: x/net returns from the
// cancelled RoundTrip once the body is closed, while its writer is still in
// the head's write. When the upstream reads again, the write ends, and the
// writer goes on to the body: it must not send an accept onto the stream,
// nor read the next exchange's bytes as this one's body.
func TestH2SiblingBodyNotReadAfterFailedExchange(t *testing.T) {
	headRead := make(chan struct{})
	s := stuckSiblingExchange(t, func(f http2.Frame) {
		if c, ok := f.(*http2.ContinuationFrame); ok && c.HeadersEnded() {
			close(headRead)
		}
	})
	s.release()
	select {
	case <-headRead:
	case <-time.After(10 * time.Second):
		t.Fatal("the upstream did not get the head once it read again")
	}
	s.assertQuiet(t, "its writer went on with the body")
}

// TestH2Late1xxAfterErrorFrame: the cancelled stream stays in the
// ClientConn's table while its head is being written, and the upstream
// sends a 103 on it: x/net's read loop calls the exchange's
// Got1xxResponse, which must not write an accept and the 103 onto the
// stream after the error frame, where the sibling would read them as the
// next exchange's answer (and from a goroutine other than the one that
// serves the stream).
func TestH2Late1xxAfterErrorFrame(t *testing.T) {
	s := stuckSiblingExchange(t, func(http2.Frame) {})
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	enc.WriteField(hpack.HeaderField{Name: ":status", Value: "103"})
	enc.WriteField(hpack.HeaderField{Name: "link", Value: "</late.css>; rel=preload"})
	if err := s.up.WriteHeaders(http2.HeadersFrameParam{StreamID: s.stream, BlockFragment: hb.Bytes(), EndHeaders: true}); err != nil {
		t.Fatalf("the upstream could not send its 103: %v", err)
	}
	s.assertQuiet(t, "a late 1xx was relayed onto a stream kept for the next exchange")
}

// TestH2FailedExchangeAfterBodyKeepsStream: a sibling's POST whose short
// body went with its head is reset by the HTTP/2 upstream before any
// answer. The owner's stream to the sibling is in step (the body was read
// whole), and must stay so past the next exchange: the failed exchange
// must not end the owner's watch for the sibling going away as if it had.
func TestH2FailedExchangeAfterBodyKeepsStream(t *testing.T) {
	up := newRawH2(t, func(s *rawStream) {
		if s.path == "/reset" {
			// Past the owner's watch delay: its watch is reading.
			time.Sleep(20 * time.Millisecond)
			s.rst(http2.ErrCodeInternal)
			return
		}
		s.headers(false, ":status", "200", "content-length", "2")
		s.data(true, []byte("ok"))
	})
	owner, client := h2Pair(t, up.url)
	key := mustKey(t, owner.tr, up.url)
	sc := dialOwner(t, owner)
	sc.SetDeadline(time.Now().Add(20 * time.Second))
	host := strings.TrimPrefix(up.url, "http://")
	br := bufio.NewReader(sc)
	send := func(head string) {
		t.Helper()
		frame, err := appendRequestFrame(nil, siblingLease(t, client, key, 1), time.Now().Add(5*time.Second), 0)
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(sc, string(frame)+head)
	}

	// The owner's watch is not always still reading when the exchange
	// fails: ten rounds.
	for round := range 10 {
		send("POST /reset HTTP/1.1\r\nHost: " + host + "\r\nContent-Length: 5\r\n\r\nhello")
		if f, err := readFrame(br, respHeaderLen, decodeResponseFrame); err != nil || f.typ != frameError {
			t.Fatalf("round %d: frame %+v, %v: want the error frame of the reset exchange, on a stream the owner keeps", round, f, err)
		}
		send("GET / HTTP/1.1\r\nHost: " + host + "\r\n\r\n")
		// The answer ends with its chunked body's last chunk and its
		// (empty) block of trailers.
		var got []byte
		for !bytes.HasSuffix(got, []byte("ok\r\n0\r\n\r\n\r\n")) {
			b, err := br.ReadByte()
			if err != nil {
				t.Fatalf("round %d: the next exchange on the stream: %q, %v: the owner ended the stream, taking the failed exchange's stop for the sibling gone", round, got, err)
			}
			got = append(got, b)
		}
	}
	sc.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if n, err := br.Read(make([]byte, 64)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("after the last round: %d bytes, %v: the owner ended the stream", n, err)
	}
}
