package proxy

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/governor"
)

// TestAdv32AdmissionCountsH2Conns: the dial admission backstop counts "the
// connections this process owns and is dialing" (NodeOptions.Admission),
// and an HTTP/1.1 connection counts from install to retire. An HTTP/2
// connection is never counted (installH2 leaves Node.open alone), so with
// h2 upstreams the backstop sees nothing in flight and admits every dial:
// with a ceiling of one and one h2c connection open, a dial to a second
// upstream must be refused as it is for HTTP/1.1 (TestAdmissionRefusesDial).
func TestAdv32AdmissionCountsH2Conns(t *testing.T) {
	ok := func(w http.ResponseWriter, r *http.Request) {}
	a, b := newH2CServer(t, ok), newH2CServer(t, ok)
	m := newMemberOpts(t, testSpecLocal, NodeOptions{SweepInterval: time.Hour, Admission: governor.NewAdmission(1)},
		func(tr *Transport) { tr.H2C = true })
	resp, err := get(t, context.Background(), m.tr, a.url+"/")
	if err != nil {
		t.Fatal(err)
	}
	drain(resp)
	if n := m.node.Stats().OpenConns; n != 1 {
		t.Fatalf("%d connections open, want the one h2c connection", n)
	}
	resp, err = get(t, context.Background(), m.tr, b.url+"/")
	if err == nil {
		drain(resp)
	}
	if !errors.Is(err, ErrNotAdmitted) {
		t.Fatalf("a second dial with one h2c connection open and a ceiling of 1: error %v, want ErrNotAdmitted (open conns now %d)", err, m.node.Stats().OpenConns)
	}
	// The count comes back down with the connection, and not below.
	m.tr.CloseIdleConnections()
	waitFor(t, 5*time.Second, "the h2c connection retired", func() bool { return m.node.Stats().OpenConns == 0 })
	if n := m.node.open.Load(); n != 0 {
		t.Fatalf("open count %d with no connection open, want 0", n)
	}
	resp, err = get(t, context.Background(), m.tr, b.url+"/")
	if err != nil {
		t.Fatalf("a dial with nothing open: %v", err)
	}
	drain(resp)
}
