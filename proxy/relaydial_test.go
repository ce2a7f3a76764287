package proxy

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"
)

// TestRelaysPayForADial: a process whose requests keep finding only a
// sibling's idle connection relays through it relaysPerDial times (over TLS
// relaysPerTLSDial), then dials a connection of its own, which its later
// requests reuse. Over TLS with HTTP/2 offered, the upstream choosing
// http/1.1, the process learns that from its first relay, which counts all
// the same. A capped key and relays that do not come close together dial
// nothing: the sibling's connection serves them all.
func TestRelaysPayForADial(t *testing.T) {
	for _, tc := range []struct {
		name   string
		tls    bool
		h2     bool // offered, by ALPN
		capped bool
		apart  time.Duration // between requests
		relays int           // before the client dials; 0: it never does
	}{
		{name: "plain", relays: relaysPerDial},
		{name: "tls", tls: true, relays: relaysPerTLSDial},
		{name: "tls-h2-offered", tls: true, h2: true, relays: relaysPerTLSDial},
		{name: "capped", capped: true},
		{name: "apart", apart: relayWindow + 100*time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var accepted atomic.Int64
			up := httptest.NewUnstartedServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
			up.Config.ConnState = func(_ net.Conn, s http.ConnState) {
				if s == http.StateNew {
					accepted.Add(1)
				}
			}
			var roots *x509.CertPool
			if tc.tls {
				up.StartTLS()
				roots = x509.NewCertPool()
				roots.AddCert(up.Certificate())
			} else {
				up.Start()
			}
			t.Cleanup(up.Close)
			ms := newFleet(t, 2, func(tr *Transport) {
				if tc.capped {
					tr.MaxConnsPerKey = 2
				}
				tr.TLSClientConfig = &tls.Config{RootCAs: roots}
				tr.HTTP2 = tc.h2
			})
			owner, client := ms[0], ms[1]
			warm(t, owner, up.URL)
			requests := 12
			if tc.relays > 0 {
				requests = tc.relays + 1
			}
			if tc.apart > 0 {
				requests = relaysPerDial + 1
			}
			for i := range requests {
				if i > 0 {
					time.Sleep(tc.apart)
				}
				if _, _, err := adv10Do(t, client.tr, "GET", up.URL, nil); err != nil {
					t.Fatalf("request %d: %v", i, err)
				}
			}
			st := client.node.Stats()
			if tc.relays == 0 {
				if st.ReusedRemote != uint64(requests) || st.Created != 0 || st.RelayDials != 0 || accepted.Load() != 1 {
					t.Fatalf("%d requests: %d relayed, %d dialed (%d after relays); the upstream accepted %d connections", requests, st.ReusedRemote, st.Created, st.RelayDials, accepted.Load())
				}
				return
			}
			if st.ReusedRemote != uint64(tc.relays) || st.Created != 1 || st.RelayDials != 1 || accepted.Load() != 2 {
				t.Fatalf("%d requests: %d relayed, %d dialed (%d after relays), want %d and 1 (1); the upstream accepted %d connections, want 2", requests, st.ReusedRemote, st.Created, st.RelayDials, tc.relays, accepted.Load())
			}
			for i := range 5 {
				if _, _, err := adv10Do(t, client.tr, "GET", up.URL, nil); err != nil {
					t.Fatalf("request %d after the dial: %v", i, err)
				}
			}
			if st := client.node.Stats(); st.ReusedLocal != 5 || st.ReusedRemote != uint64(tc.relays) {
				t.Fatalf("after the dial, 5 requests: %d on the client's own connection, %d relayed in all", st.ReusedLocal, st.ReusedRemote)
			}
		})
	}
}

// TestFailedPaidDialsBackOff: an upstream whose established connection
// serves and whose new ones hang in the TLS handshake. Each dial the relays
// pay for fails, and doubles the relays the next must wait for: over 250
// requests, each served through the sibling's connection, the process tries
// 3 dials (after 32, 64 and 128 relays), not one per 32; a dial that
// connects forgets the failures.
func TestFailedPaidDialsBackOff(t *testing.T) {
	u := newStallingTLSUpstream(t)
	ms := newFleet(t, 2, func(tr *Transport) { tr.TLSClientConfig = &tls.Config{RootCAs: u.roots} })
	owner, client := ms[0], ms[1]
	warm(t, owner, u.url)
	for i := range 250 {
		if _, _, err := roundTripWithin(client.tr, u.url, 200*time.Millisecond); err != nil {
			t.Fatalf("request %d: %v; want it served through the sibling's connection", i, err)
		}
	}
	if tries := u.accepted.Load() - 1; tries != 3 {
		t.Fatalf("%d paid dials tried in 250 requests; want 3 (after 32, 64 and 128 relays)", tries)
	}
	req, _ := http.NewRequest("GET", u.url, nil)
	e, err := client.tr.upstream(req)
	if err != nil {
		t.Fatal(err)
	}
	if got := e.relaysOwed(); got != relaysPerTLSDial<<3 {
		t.Fatalf("relays owed after 3 failed dials: %d, want %d", got, relaysPerTLSDial<<3)
	}
	e.tookOwn()
	if got := e.relaysOwed(); got != relaysPerTLSDial {
		t.Fatalf("relays owed after a connection of its own: %d, want %d", got, relaysPerTLSDial)
	}
}

// stallingTLSUpstream is a TLS upstream whose first connection serves 200
// "ok" to every request and whose later connections never handshake; it
// counts the stalled connections open at once (each one a dial in flight
// somewhere in the fleet) and the most ever open together.
type stallingTLSUpstream struct {
	url      string
	roots    *x509.CertPool
	accepted atomic.Int32
	cur, max atomic.Int32
}

func newStallingTLSUpstream(t *testing.T) *stallingTLSUpstream {
	ts := httptest.NewUnstartedServer(nil)
	ts.StartTLS()
	cert := ts.TLS.Certificates
	u := &stallingTLSUpstream{roots: x509.NewCertPool()}
	u.roots.AddCert(ts.Certificate())
	ts.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	serveConns(t, ln, func(c net.Conn, id int) {
		u.accepted.Add(1)
		if id > 1 {
			n := u.cur.Add(1)
			for {
				m := u.max.Load()
				if n <= m || u.max.CompareAndSwap(m, n) {
					break
				}
			}
			io.Copy(io.Discard, c)
			u.cur.Add(-1)
			return
		}
		tc := tls.Server(c, &tls.Config{Certificates: cert})
		br := bufio.NewReader(tc)
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			io.Copy(io.Discard, req.Body)
			io.WriteString(tc, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}
	})
	u.url = "https://" + ln.Addr().String() + "/"
	return u
}
