package proxy

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"
)

// TestAdv72bCloseDuringOwedDial: the client owes a dial (relaysPerTLSDial
// relays through the owner's TLS connection) and its next request is in the
// dial's handshake when the client's Node is Closed. Close returns without
// waiting for the handshake, the request returns once the handshake ends,
// and the connection it dialed is not kept: the upstream sees it closed, and
// the client counts no connection open.
func TestAdv72bCloseDuringOwedDial(t *testing.T) {
	var open atomic.Int64
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	up.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		switch s {
		case http.StateNew:
			open.Add(1)
		case http.StateClosed, http.StateHijacked:
			open.Add(-1)
		}
	}
	up.StartTLS()
	t.Cleanup(up.Close)
	roots := x509.NewCertPool()
	roots.AddCert(up.Certificate())
	var block atomic.Bool
	entered, gate := make(chan struct{}, 1), make(chan struct{})
	ms := newFleet(t, 2, func(tr *Transport) {
		tr.TLSClientConfig = &tls.Config{RootCAs: roots, VerifyConnection: func(tls.ConnectionState) error {
			if block.Load() {
				select {
				case entered <- struct{}{}:
				default:
				}
				<-gate
			}
			return nil
		}}
	})
	owner, client := ms[0], ms[1]
	warm(t, owner, up.URL)
	for i := range relaysPerTLSDial {
		if _, _, err := adv10Do(t, client.tr, "GET", up.URL, nil); err != nil {
			t.Fatalf("relay %d: %v", i, err)
		}
	}
	if st := client.node.Stats(); st.Created != 0 || st.ReusedRemote != relaysPerTLSDial {
		t.Fatalf("setup: %+v", st)
	}
	block.Store(true)
	done := make(chan error, 1)
	go func() {
		_, _, err := adv10Do(t, client.tr, "GET", up.URL, nil)
		done <- err
	}()
	select {
	case <-entered:
	case <-time.After(3 * time.Second):
		close(gate)
		t.Fatalf("the owed request did not dial: %+v", client.node.Stats())
	}
	closed := make(chan struct{})
	go func() { client.node.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(2 * time.Second):
		close(gate)
		t.Fatal("Node.Close waited for a dial's handshake")
	}
	close(gate)
	select {
	case err := <-done:
		t.Logf("the owed request after Close: %v", err)
	case <-time.After(3 * time.Second):
		t.Fatal("the owed request did not return after its handshake ended")
	}
	waitFor(t, 3*time.Second, "the dialed connection to close", func() bool { return open.Load() == 1 })
	if o := client.node.open.Load(); o != 0 {
		t.Fatalf("client counts %d connections open after Close", o)
	}
}
