package proxy

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// adv77dUp is a scripted upstream, plain or TLS, that counts the request
// heads it received per path and can be stopped (connections closed, its
// goroutines ended) before a test counts goroutines.
//
//	/held  discards the body, answers a chunked "first", then holds the
//	       rest ("last") until release
//	/echo  answers the request body
//	else   discards the body, answers "ok"
type adv77dUp struct {
	ln      net.Listener
	url     string
	cc      *tls.Config // the client's config for a TLS upstream
	release chan struct{}
	relOnce sync.Once
	mu      sync.Mutex
	conns   map[net.Conn]struct{}
	counts  map[string]int
	wg      sync.WaitGroup
	stopped atomic.Bool
}

func newAdv77dUp(t *testing.T, useTLS bool) *adv77dUp {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := &adv77dUp{ln: ln, url: "http://" + ln.Addr().String(), release: make(chan struct{}),
		conns: map[net.Conn]struct{}{}, counts: map[string]int{}}
	var sc *tls.Config
	if useTLS {
		ts := httptest.NewUnstartedServer(http.NotFoundHandler())
		ts.StartTLS()
		cert := ts.TLS.Certificates[0]
		roots := x509.NewCertPool()
		roots.AddCert(ts.Certificate())
		ts.Close()
		sc = &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"http/1.1"}}
		u.cc = &tls.Config{RootCAs: roots, ServerName: "example.com"}
		u.url = "https://" + ln.Addr().String()
	}
	t.Cleanup(u.stop)
	u.wg.Add(1)
	go func() {
		defer u.wg.Done()
		for {
			raw, err := ln.Accept()
			if err != nil {
				return
			}
			var c net.Conn = raw
			if sc != nil {
				c = tls.Server(raw, sc)
			}
			u.mu.Lock()
			if u.stopped.Load() {
				u.mu.Unlock()
				c.Close()
				return
			}
			u.conns[c] = struct{}{}
			u.wg.Add(1)
			u.mu.Unlock()
			go func() {
				defer u.wg.Done()
				defer func() {
					u.mu.Lock()
					delete(u.conns, c)
					u.mu.Unlock()
					c.Close()
				}()
				u.serve(c)
			}()
		}
	}()
	return u
}

func (u *adv77dUp) serve(c net.Conn) {
	br := bufio.NewReader(c)
	for {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		u.mu.Lock()
		u.counts[req.URL.Path]++
		u.mu.Unlock()
		switch req.URL.Path {
		case "/held":
			if _, err := io.Copy(io.Discard, req.Body); err != nil {
				return
			}
			if _, err := io.WriteString(c, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n"); err != nil {
				return
			}
			select {
			case <-u.release:
			case <-time.After(15 * time.Second):
			}
			if _, err := io.WriteString(c, "4\r\nlast\r\n0\r\n\r\n"); err != nil {
				return
			}
		case "/echo":
			b, err := io.ReadAll(req.Body)
			if err != nil {
				return
			}
			if _, err := io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: "+strconv.Itoa(len(b))+"\r\n\r\n"+string(b)); err != nil {
				return
			}
		default:
			if _, err := io.Copy(io.Discard, req.Body); err != nil {
				return
			}
			if _, err := io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"); err != nil {
				return
			}
		}
	}
}

// count is how many request heads for path the upstream received.
func (u *adv77dUp) count(path string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.counts[path]
}

// open is how many connections the upstream still has open.
func (u *adv77dUp) open() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.conns)
}

func (u *adv77dUp) releaseAll() { u.relOnce.Do(func() { close(u.release) }) }

// stop closes the listener and every connection and waits for the
// upstream's goroutines.
func (u *adv77dUp) stop() {
	u.releaseAll()
	u.mu.Lock()
	u.stopped.Store(true)
	u.ln.Close()
	for c := range u.conns {
		c.Close()
	}
	u.mu.Unlock()
	u.wg.Wait()
}

var errAdv77dBodyClosed = errors.New("adv77d: request body closed")

// adv77dTick is how often a slow body yields its next 512 bytes.
const adv77dTick = 100 * time.Millisecond

// adv77dBody is a request body of size bytes ('x') that gives its first
// free bytes at once and the rest 512 bytes every adv77dTick (all at once
// once flow is closed), or fails once it is closed. It records calls that begin
// after done was set (the RoundTrip that owns it returned, or the response
// body's Close returned) and Reads still under way at that moment.
type adv77dBody struct {
	size, free int
	eofDelay   time.Duration // how long the Read that ends the body takes
	flow       chan struct{}
	flowOnce   sync.Once
	closed     chan struct{}
	closeOnce  sync.Once

	mu   sync.Mutex
	sent int

	done       atomic.Bool
	inRead     atomic.Int32
	reads      atomic.Int32
	lateReads  atomic.Int32
	lateCloses atomic.Int32
	readAtDone atomic.Int32
}

func newAdv77dBody(size, free int) *adv77dBody {
	return &adv77dBody{size: size, free: free, flow: make(chan struct{}), closed: make(chan struct{})}
}

func (b *adv77dBody) Read(p []byte) (int, error) {
	b.inRead.Add(1)
	defer b.inRead.Add(-1)
	b.reads.Add(1)
	if b.done.Load() {
		b.lateReads.Add(1)
	}
	select {
	case <-b.closed:
		return 0, errAdv77dBodyClosed
	default:
	}
	b.mu.Lock()
	sent := b.sent
	b.mu.Unlock()
	if sent >= b.size {
		if b.eofDelay > 0 {
			select {
			case <-time.After(b.eofDelay):
			case <-b.closed:
				return 0, errAdv77dBodyClosed
			}
		}
		return 0, io.EOF
	}
	n := len(p)
	lim := b.size
	select {
	case <-b.flow:
	default:
		if sent < b.free {
			lim = b.free
			break
		}
		// A slow client: the rest trickles, 512 bytes a tick.
		select {
		case <-b.flow:
		case <-b.closed:
			return 0, errAdv77dBodyClosed
		case <-time.After(adv77dTick):
			lim = min(sent+512, b.size)
		}
	}
	if n > lim-sent {
		n = lim - sent
	}
	for i := range n {
		p[i] = 'x'
	}
	b.mu.Lock()
	b.sent += n
	b.mu.Unlock()
	return n, nil
}

func (b *adv77dBody) Close() error {
	if b.done.Load() {
		b.lateCloses.Add(1)
	}
	b.closeOnce.Do(func() { close(b.closed) })
	return nil
}

// markDone sets done, counting a Read under way at that moment.
func (b *adv77dBody) markDone() {
	b.done.Store(true)
	if b.inRead.Load() > 0 {
		b.readAtDone.Add(1)
	}
}

func (b *adv77dBody) letFlow() { b.flowOnce.Do(func() { close(b.flow) }) }
