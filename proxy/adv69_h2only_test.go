package proxy

import (
	"crypto/tls"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/orbitproxy/orbit/orbitpool"
)

// TestAdv69H2OnlyUpstreamTableFull: an https upstream that speaks only
// HTTP/2 (it refuses a ClientHello without h2, as gRPC servers that
// enforce ALPN do) is served over h2 while the table has room. With the
// table full, its request cannot be served over HTTP/1.1; it must be
// refused for what happened (the table had no room: orbitpool.ErrFull),
// not reported as a TLS failure of the upstream.
func TestAdv69H2OnlyUpstreamTableFull(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	h1, tc := adv68cTLSH1(t, release)
	var hellos, refused atomic.Int32
	h2 := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("h2"))
	}))
	h2.EnableHTTP2 = true
	h2.TLS = &tls.Config{NextProtos: []string{"h2"}}
	h2.TLS.GetConfigForClient = func(hi *tls.ClientHelloInfo) (*tls.Config, error) {
		hellos.Add(1)
		if slices.Contains(hi.SupportedProtos, "h2") {
			return nil, nil
		}
		refused.Add(1)
		c := h2.TLS.Clone()
		c.GetConfigForClient = nil
		c.NextProtos = []string{"h2-only"} // no overlap, no http/1.1 fallback
		return c, nil
	}
	h2.Config.ConnState = func(net.Conn, http.ConnState) {}
	h2.StartTLS()
	t.Cleanup(h2.Close)
	tc.RootCAs.AddCert(h2.Certificate())
	m := newMember(t, orbitpool.PoolSpec{Lanes: 1, Keys: 4, ResourcesPerLane: 2}, func(tr *Transport) {
		tr.HTTP2 = true
		tr.TLSClientConfig = tc
	})
	// Sanity: with room, it is served over h2 (then the connection is
	// retired to free the slot for the held streams).
	resp, body, err := adv10Do(t, m.tr, "GET", h2.URL+"/", nil)
	if err != nil || body != "h2" || resp.ProtoMajor != 2 {
		t.Fatalf("h2-only upstream with room: %q, %v", body, err)
	}
	m.tr.CloseIdleConnections()
	req, _ := http.NewRequest("GET", h2.URL+"/", nil)
	_, key, err := m.tr.Upstream(req)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 3e9, "the h2 connection gone", func() bool { return m.pool.Live(key) == 0 })

	holdStreams(t, m, h1.URL, 2)
	before := hellos.Load()
	_, _, err = adv10Do(t, m.tr, "GET", h2.URL+"/", nil)
	dials := hellos.Load() - before
	if err == nil {
		t.Fatalf("served an h2-only upstream with the table full?")
	}
	if !errors.Is(err, orbitpool.ErrFull) || !strings.Contains(err.Error(), "table") {
		t.Fatalf("an h2-only https upstream's request with the table full failed with %q (ErrFull: %v), after %d TLS handshakes it refused; want the table's error", err, errors.Is(err, orbitpool.ErrFull), dials)
	}
}
