package proxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"golang.org/x/net/http2"
)

// TestAdv28WebSocketToHTTP2UpstreamLikeNetHTTP: a WebSocket upgrade to an
// https upstream that also speaks HTTP/2. HTTP/2 has no upgrade (x/net
// refuses the request's Upgrade header), so net/http's Transport sends
// such a request on an HTTP/1.1 connection of its own (Request's
// requiresHTTP1), and the upgrade works. With Transport.HTTP2 set, on the
// local path (with and without an HTTP/2 connection in the pool) and
// through a sibling whose owner holds one, the upgrade works as well: a
// 101 and a tunnel that echoes, on a connection that never joins a pool.
func TestAdv28WebSocketToHTTP2UpstreamLikeNetHTTP(t *testing.T) {
	for _, h2c := range []bool{false, true} {
		t.Run(map[bool]string{false: "https", true: "h2c"}[h2c], func(t *testing.T) { testAdv28WebSocketToHTTP2(t, h2c) })
	}
}

// testAdv28WebSocketToHTTP2 runs the upgrades against an https upstream
// offering h2 by ALPN, or with h2c an http upstream that speaks HTTP/1.1
// and h2c with prior knowledge (Transport.H2C), where net/http's own
// Transport speaks HTTP/1.1: the upgrade works only there.
func testAdv28WebSocketToHTTP2(t *testing.T, h2c bool) {
	ts := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") != "websocket" {
			io.WriteString(w, "plain "+r.Proto)
			return
		}
		if r.ProtoMajor != 1 {
			http.Error(w, "no upgrade over "+r.Proto, http.StatusBadRequest)
			return
		}
		c, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
		brw.Flush()
		line, _ := brw.ReadString('\n')
		io.WriteString(c, "echo:"+line)
	}))
	roots := x509.NewCertPool()
	if h2c {
		ts.Config.Protocols = new(http.Protocols)
		ts.Config.Protocols.SetHTTP1(true)
		ts.Config.Protocols.SetUnencryptedHTTP2(true)
		ts.Start()
	} else {
		ts.EnableHTTP2 = true
		if err := http2.ConfigureServer(ts.Config, &http2.Server{}); err != nil {
			t.Fatal(err)
		}
		ts.StartTLS()
		roots.AddCert(ts.Certificate())
	}
	t.Cleanup(ts.Close)

	upgrade := func(t *testing.T, name string, rt http.RoundTripper) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", ts.URL+"/ws", nil)
		req.Header.Set("Connection", "Upgrade")
		req.Header.Set("Upgrade", "websocket")
		resp, err := rt.RoundTrip(req)
		if err != nil {
			t.Errorf("%s: %v, want 101 as net/http", name, err)
			return
		}
		defer resp.Body.Close()
		rw, ok := resp.Body.(io.ReadWriter)
		if resp.StatusCode != http.StatusSwitchingProtocols || !ok {
			b, _ := io.ReadAll(resp.Body)
			t.Errorf("%s: %d %q, want 101 as net/http", name, resp.StatusCode, b)
			return
		}
		io.WriteString(rw, "hi\n")
		if l, err := bufio.NewReader(rw).ReadString('\n'); l != "echo:hi\n" {
			t.Errorf("%s: tunnel gave %q, %v", name, l, err)
		}
	}
	plain := func(t *testing.T, name string, rt http.RoundTripper) {
		t.Helper()
		resp, body, err := adv10Do(t, rt, "GET", ts.URL+"/plain", nil)
		if err != nil || resp.StatusCode != 200 || body != "plain HTTP/2.0" {
			t.Errorf("%s: plain request: %v %q, want HTTP/2", name, err, body)
		}
	}

	if !h2c {
		ref := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}, ForceAttemptHTTP2: true}
		t.Cleanup(ref.CloseIdleConnections)
		plain(t, "net/http", ref)
		upgrade(t, "net/http", ref)
	}

	conf := func(tr *Transport) {
		tr.HTTP2 = !h2c
		tr.H2C = h2c
		tr.TLSClientConfig = &tls.Config{RootCAs: roots}
	}
	fresh := newMember(t, testSpecLocal, conf)
	upgrade(t, "local, nothing pooled", fresh.tr)
	plain(t, "local after the upgrade", fresh.tr)

	owner, client := remotePair(t, conf)
	plain(t, "owner", owner.tr)
	upgrade(t, "local, HTTP/2 pooled", owner.tr)
	upgrade(t, "sibling, owner has HTTP/2", client.tr)
	plain(t, "sibling after the upgrade", client.tr)
	plain(t, "owner after the upgrades", owner.tr)
}
