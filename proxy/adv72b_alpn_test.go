package proxy

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
)

// TestAdv72bALPNH1RelaysCount: the transport offers HTTP/2 (Caddy's default
// for https) and the upstream picks http/1.1 by ALPN. The client has never
// dialed it: it learns the protocol from its first relay's response. Every
// relay over HTTP/1.1 is paid rent all the same, so the client dials after
// relaysPerTLSDial relays, as it does with HTTP/2 off (TestRelaysPayForADial
// "tls"). The relay counted only if speaksH2 was already false before it
// was sent, so the first, sent while the protocol was unknown, is lost.
func TestAdv72bALPNH1RelaysCount(t *testing.T) {
	var accepted atomic.Int64
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	up.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			accepted.Add(1)
		}
	}
	up.StartTLS() // NextProtos: http/1.1 only
	t.Cleanup(up.Close)
	roots := x509.NewCertPool()
	roots.AddCert(up.Certificate())
	ms := newFleet(t, 2, func(tr *Transport) {
		tr.HTTP2 = true
		tr.TLSClientConfig = &tls.Config{RootCAs: roots}
	})
	owner, client := ms[0], ms[1]
	warm(t, owner, up.URL)
	for i := range relaysPerTLSDial + 1 {
		resp, _, err := adv10Do(t, client.tr, "GET", up.URL, nil)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		if resp.ProtoMajor != 1 {
			t.Fatalf("upstream spoke HTTP/%d", resp.ProtoMajor)
		}
	}
	if st := client.node.Stats(); st.ReusedRemote != relaysPerTLSDial || st.Created != 1 || accepted.Load() != 2 {
		t.Fatalf("%d requests to an http/1.1-by-ALPN upstream: %d relayed, %d dialed (want %d and 1); the upstream accepted %d connections",
			relaysPerTLSDial+1, st.ReusedRemote, st.Created, relaysPerTLSDial, accepted.Load())
	}
}
