package proxy

import (
	"crypto/tls"
	"crypto/x509"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"
)

// TestAdv74aPaidDialCompletesAfterClose: a process owes a dial; the dial
// the relays paid for takes 400ms to handshake (a slow upstream, not a
// hanging one). The process's Node and then its pool close 100ms into the
// dial, as a process that leaves does; the dial then completes. Properties:
// the request ends (with an error: its process closed) by its deadline; the
// connection dialed after Close is closed, not leaked (the upstream holds
// only the owner's connection); the process counts nothing open.
func TestAdv74aPaidDialCompletesAfterClose(t *testing.T) {
	var hs atomic.Int32
	var open atomic.Int32
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		io.WriteString(w, "ok")
	}))
	up.Config.ErrorLog = log.New(io.Discard, "", 0)
	up.Config.ConnState = func(c net.Conn, s http.ConnState) {
		switch s {
		case http.StateNew:
			open.Add(1)
		case http.StateClosed, http.StateHijacked:
			open.Add(-1)
		}
	}
	up.TLS = &tls.Config{GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
		if hs.Add(1) > 1 {
			time.Sleep(400 * time.Millisecond)
		}
		return nil, nil
	}}
	up.StartTLS()
	t.Cleanup(up.Close)
	roots := x509.NewCertPool()
	roots.AddCert(up.Certificate())
	ms := newFleet(t, 2, func(tr *Transport) { tr.TLSClientConfig = &tls.Config{RootCAs: roots} })
	owner, client := ms[0], ms[1]
	warm(t, owner, up.URL)
	adv74aOwe(t, client, up.URL)
	const d = 4 * time.Second
	done := make(chan error, 1)
	go func() {
		ctx, cancel := contextWithTimeout(d)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", up.URL, nil)
		resp, err := client.tr.RoundTrip(req)
		if err == nil {
			drain(resp)
		}
		done <- err
	}()
	waitFor(t, 3*time.Second, "the paid dial", func() bool { return hs.Load() >= 2 })
	time.Sleep(100 * time.Millisecond)
	client.node.Close()
	client.pool.Close()
	var err error
	select {
	case err = <-done:
	case <-time.After(d + time.Second):
		t.Fatalf("RoundTrip still running past its deadline")
	}
	t.Logf("request: %v", err)
	waitFor(t, 3*time.Second, "the upstream to hold only the owner's connection", func() bool { return open.Load() == 1 })
	if o, h := adv70Counted(client); o != 0 || h != 0 {
		t.Errorf("after Close: n.open %d, held %d", o, h)
	}
	if dl := client.node.dialing.Load(); dl != 0 {
		t.Errorf("node.dialing %d", dl)
	}
}
