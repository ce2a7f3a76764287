package proxy

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// adv11StuckUpstream is an h2 upstream over TLS that grants a large flow
// control window, answers the first request 200 with no body at once, and
// after adv11StuckAfter reads nothing more from the connection: a client
// still sending the request body fills the socket and blocks in its write.
type adv11StuckUpstream struct {
	ln    net.Listener
	roots *x509.CertPool
	mu    sync.Mutex
	conns []net.Conn
}

func newAdv11StuckUpstream(t *testing.T) *adv11StuckUpstream {
	ts := httptest.NewUnstartedServer(nil)
	ts.StartTLS()
	certs := ts.TLS.Certificates
	roots := x509.NewCertPool()
	roots.AddCert(ts.Certificate())
	ts.Close()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: certs, NextProtos: []string{"h2"}})
	if err != nil {
		t.Fatal(err)
	}
	u := &adv11StuckUpstream{ln: ln, roots: roots}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u.mu.Lock()
			u.conns = append(u.conns, c)
			u.mu.Unlock()
			go u.serve(c)
		}
	}()
	t.Cleanup(u.close)
	return u
}

func (u *adv11StuckUpstream) close() {
	u.ln.Close()
	u.mu.Lock()
	defer u.mu.Unlock()
	for _, c := range u.conns {
		c.Close()
	}
}

func (u *adv11StuckUpstream) serve(c net.Conn) {
	serveH2Frames(c, []http2.Setting{{ID: http2.SettingInitialWindowSize, Val: 1 << 30}}, func(fr *http2.Framer, f *http2.HeadersFrame) {
		var b bytes.Buffer
		enc := hpack.NewEncoder(&b)
		enc.WriteField(hpack.HeaderField{Name: ":status", Value: "200"})
		enc.WriteField(hpack.HeaderField{Name: "content-length", Value: "0"})
		fr.WriteHeaders(http2.HeadersFrameParam{StreamID: f.StreamID, BlockFragment: b.Bytes(), EndStream: true, EndHeaders: true})
		// Reads on for a while, so that the client has the response
		// before its write blocks (the ClientConn's State waits behind a
		// blocked write, and the stream's end reads it), then reads
		// nothing more; close closes c.
		c.SetReadDeadline(time.Now().Add(adv11StuckAfter))
		for {
			if _, err := fr.ReadFrame(); err != nil {
				return
			}
		}
	})
}

const adv11StuckAfter = 300 * time.Millisecond

// TestAdv11H2RetireBehindStuckWrite: an HTTP/2 connection over TLS whose
// upstream answered a request and stopped reading while the request body
// was still going out: the ClientConn's write of it is blocked in the TLS
// connection. The stream ended for the pool (the response had no body), so
// the connection is idle and CloseIdleConnections retires it in good order.
// That retirement sends close_notify, which waits behind the blocked write:
// it must give up after closeWait as it does otherwise, and close the
// socket, rather than hang, with Node.Close waiting for it, until the
// upstream reads again. (The sweeper, blocked in the ClientConn's State
// behind the same write, is let go by that close too.)
func TestAdv11H2RetireBehindStuckWrite(t *testing.T) {
	u := newAdv11StuckUpstream(t)
	m := newMember(t, testSpec, func(tr *Transport) {
		tr.HTTP2 = true
		tr.TLSClientConfig = &tls.Config{RootCAs: u.roots}
		tr.DialTimeout = 2 * time.Second
	})
	url := "https://" + u.ln.Addr().String() + "/"
	const size = 256 << 20
	req, err := http.NewRequest("POST", url, io.LimitReader(zeros{}, size))
	if err != nil {
		t.Fatal(err)
	}
	req.ContentLength = size
	resp, err := m.tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.ProtoMajor != 2 {
		t.Fatalf("%s %d, want HTTP/2 200", resp.Proto, resp.StatusCode)
	}
	key := mustKey(t, m.tr, url)
	first, _ := m.pool.Candidates(key, nil)
	if len(first) != 1 {
		t.Fatalf("registered %+v, want one connection", first)
	}
	time.Sleep(2 * adv11StuckAfter) // the body fills the socket
	m.tr.CloseIdleConnections()
	closed := make(chan struct{})
	go func() {
		m.node.Close()
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(8 * closeWait):
		t.Errorf("Node.Close did not return within %s: the retirement of the connection waits behind the blocked write", 8*closeWait)
		u.close() // unblocks it
		<-closed
	}
	if c, _ := m.pool.Candidates(key, nil); len(c) != 0 {
		t.Errorf("after Node.Close: %+v still in the pool", c)
	}
}
