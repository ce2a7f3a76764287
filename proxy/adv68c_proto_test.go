package proxy

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/orbitproxy/orbit/orbitpool"
)

// adv68cTLSH1 is an https upstream that speaks HTTP/1.1 only (ALPN
// http/1.1): /stream holds its body open until release is closed, anything
// else answers "ok".
func adv68cTLSH1(t *testing.T, release chan struct{}) (*httptest.Server, *tls.Config) {
	t.Helper()
	ts := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/stream" {
			io.WriteString(w, "first")
			w.(http.Flusher).Flush()
			<-release
			return
		}
		io.WriteString(w, "ok")
	}))
	ts.StartTLS()
	t.Cleanup(ts.Close)
	roots := x509.NewCertPool()
	roots.AddCert(ts.Certificate())
	return ts, &tls.Config{RootCAs: roots}
}

// TestAdv68cHTTPSUpstreamSpeakingH1: a transport that offers h2 to an https
// upstream (versions 1.1 2) that chose http/1.1 by ALPN on every connection
// speaks HTTP/1.1 to it, and that upstream is under no cap. With the table
// full, its request goes on a connection of its own, as the stock
// transport would serve it.
func TestAdv68cHTTPSUpstreamSpeakingH1(t *testing.T) {
	spec := orbitpool.PoolSpec{Lanes: 1, Keys: 4, ResourcesPerLane: 2}
	for _, offerH2 := range []bool{false, true} {
		name := "h1only"
		if offerH2 {
			name = "offersH2"
		}
		t.Run(name, func(t *testing.T) {
			release := make(chan struct{})
			defer close(release)
			ts, tc := adv68cTLSH1(t, release)
			m := newMember(t, spec, func(tr *Transport) {
				tr.HTTP2 = offerH2
				tr.TLSClientConfig = tc
			})
			holdStreams(t, m, ts.URL, 2) // the upstream chose http/1.1 on both
			resp, body, err := adv10Do(t, m.tr, "GET", ts.URL+"/once", nil)
			if err != nil || body != "ok" || resp.ProtoMajor != 1 {
				t.Fatalf("an https/1.1 request with the table full: %q, %v; want it served on a connection of its own", body, err)
			}
			if s := m.node.Stats(); s.Unpooled != 1 {
				t.Fatalf("stats %+v: want 1 unpooled", s)
			}
		})
	}
}

// TestAdv68cDialingCapStaysInTable: a key under MaxDialingPerKey alone (no
// MaxConnsPerKey) is capped too: with the table full its request fails with
// the table's error and never dials outside it.
func TestAdv68cDialingCapStaysInTable(t *testing.T) {
	spec := orbitpool.PoolSpec{Lanes: 1, Keys: 4, ResourcesPerLane: 2}
	release, closed := make(chan struct{}), make(chan bool, 4)
	defer close(release)
	url := unpooledUpstream(t, release, closed)
	m := newMember(t, spec, func(tr *Transport) { tr.MaxDialingPerKey = 4 })
	holdStreams(t, m, url, 2)
	if _, _, err := adv10Do(t, m.tr, "GET", url+"/once", nil); !errors.Is(err, orbitpool.ErrFull) {
		t.Fatalf("a dialing-capped key's request with the table full: %v; want the table's error", err)
	}
	if s := m.node.Stats(); s.Unpooled != 0 || s.OpenConns != 2 {
		t.Fatalf("stats %+v: want nothing unpooled", s)
	}
	select {
	case <-closed:
		t.Fatal("the upstream saw a connection for the capped request")
	default:
	}
}

// TestAdv68cKeysFull: with every key entry holding a connection, a request
// to a further upstream goes on a connection of its own and is served; its
// connection is kept for the next such request, and closed with the idle
// ones.
func TestAdv68cKeysFull(t *testing.T) {
	spec := orbitpool.PoolSpec{Lanes: 1, Keys: 2, ResourcesPerLane: 8}
	rel1, rel2 := make(chan struct{}), make(chan struct{})
	closed := make(chan bool, 8)
	u1 := unpooledUpstream(t, rel1, closed)
	u2 := unpooledUpstream(t, rel2, closed)
	u3 := unpooledUpstream(t, make(chan struct{}), closed)
	m := newMember(t, spec, nil)
	h1 := holdStreams(t, m, u1, 1)
	h2 := holdStreams(t, m, u2, 1)
	var first string
	for i := range 3 {
		if _, body, err := adv10Do(t, m.tr, "GET", u3+"/conn", nil); err != nil || body == "" || i > 0 && body != first {
			t.Fatalf("request %d to a third upstream with the keys full: %q, %v; want it on request 0's connection, %q", i, body, err, first)
		} else if i == 0 {
			first = body
		}
	}
	if s := m.node.Stats(); s.Unpooled != 3 || s.OpenConns != 3 {
		t.Fatalf("stats %+v: want 3 requests unpooled, on one connection kept", s)
	}
	m.tr.CloseIdleConnections()
	if s := m.node.Stats(); s.OpenConns != 2 {
		t.Fatalf("stats %+v: the connection outside the table outlived CloseIdleConnections", s)
	}
	close(rel1)
	close(rel2)
	for _, r := range append(h1, h2...) {
		io.ReadAll(r.Body)
		r.Body.Close()
	}
}
