package proxy

import (
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// peerPair dials a loopback peer run by serve and returns the client
// side as a conn, TLS if useTLS. serve gets the server side (TLS or plain)
// and the raw TCP connection under it.
func peerPair(t *testing.T, useTLS bool, serve func(c net.Conn, raw *net.TCPConn)) (*conn, <-chan struct{}) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	var cfg *tls.Config
	if useTLS {
		ts := httptest.NewTLSServer(http.NotFoundHandler())
		cfg = ts.TLS.Clone()
		ts.Close()
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		raw, err := ln.Accept()
		if err != nil {
			return
		}
		defer raw.Close()
		raw.SetDeadline(time.Now().Add(10 * time.Second))
		var c net.Conn = raw
		if cfg != nil {
			tc := tls.Server(raw, cfg)
			if tc.Handshake() != nil {
				return
			}
			c = tc
		}
		serve(c, raw.(*net.TCPConn))
	}()
	nc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	var cc net.Conn = nc
	if useTLS {
		tc := tls.Client(nc, &tls.Config{InsecureSkipVerify: true})
		if err := tc.Handshake(); err != nil {
			t.Fatal(err)
		}
		cc = tc
	}
	return newConn(cc, nc), done
}

// TestAdv4CloseAfterPeerTLSExactBound: over TLS, a peer that sends exactly
// maxCloseDrain bytes after our close_notify and then closes in good order
// (close_notify, FIN) has closed.
func TestAdv4CloseAfterPeerTLSExactBound(t *testing.T) {
	c, done := peerPair(t, true, func(pc net.Conn, _ *net.TCPConn) {
		io.Copy(io.Discard, pc) // until our close_notify
		pc.Write(make([]byte, maxCloseDrain))
		pc.Close()
	})
	start := time.Now()
	closed := c.closeAfterPeer(2*time.Second, nil)
	if !closed || time.Since(start) > time.Second {
		t.Errorf("closeAfterPeer = %v after %v, want true at once", closed, time.Since(start))
	}
	<-done
}

// TestAdv4CloseAfterPeerClosedWithoutNotify: a TLS peer that answers our
// close_notify by closing its socket at once, without a close_notify of its
// own (a quiet shutdown, as many TLS stacks do on a connection they are
// done with), has closed its side: closeAfterPeer must say so, or a failed
// exchange calls the upstream slow to close (lingeredInVain) and a moved
// connection turns moves off for the key (Node.moved).
func TestAdv4CloseAfterPeerClosedWithoutNotify(t *testing.T) {
	c, done := peerPair(t, true, func(pc net.Conn, raw *net.TCPConn) {
		io.Copy(io.Discard, pc) // until our close_notify
		raw.Close()             // no close_notify
	})
	start := time.Now()
	closed := c.closeAfterPeer(2*time.Second, nil)
	if !closed {
		t.Errorf("closeAfterPeer = false after %v: a TLS peer that closed its socket at once counts as slow to close", time.Since(start))
	}
	<-done
}

// TestAdv4CloseAfterPeerReset: a peer that resets the connection once it
// reads our half-close has let it go at once.
func TestAdv4CloseAfterPeerReset(t *testing.T) {
	for _, useTLS := range []bool{false, true} {
		c, done := peerPair(t, useTLS, func(pc net.Conn, raw *net.TCPConn) {
			io.Copy(io.Discard, pc)
			raw.SetLinger(0)
			raw.Close()
		})
		start := time.Now()
		closed := c.closeAfterPeer(2*time.Second, nil)
		if !closed {
			t.Errorf("tls=%v: closeAfterPeer = false after %v: a peer that reset the connection at once counts as slow to close", useTLS, time.Since(start))
		}
		<-done
	}
}
