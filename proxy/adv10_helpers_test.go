package proxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/orbitpool"
)

// adv10Upstream is a scripted HTTP/1.1 upstream, plain or TLS (full-size
// records, as nginx sends them). answer is called for each request read on
// a connection with the connection's number (from 1) and the request's
// number on it (from 1); the connection is closed when answer returns false
// or the test ends. Unscripted paths (answer returns handled false through
// adv10Fresh) get a body naming the connection, the request number and the
// path, so that a caller can tell its own response from any other.
type adv10Upstream struct {
	base  string
	roots *x509.CertPool
	conns atomic.Int32

	mu   sync.Mutex
	seen []string // "c<conn> <method> <path>", in arrival order
}

type adv10Answer func(c net.Conn, br *bufio.Reader, req *http.Request, conn, n int) bool

func newAdv10Upstream(t *testing.T, withTLS bool, answer adv10Answer) *adv10Upstream {
	t.Helper()
	u := &adv10Upstream{}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u.base = "http://" + ln.Addr().String()
	if withTLS {
		ts := httptest.NewUnstartedServer(nil)
		ts.StartTLS()
		cfg := &tls.Config{Certificates: ts.TLS.Certificates, DynamicRecordSizingDisabled: true}
		u.roots = x509.NewCertPool()
		u.roots.AddCert(ts.Certificate())
		ts.Close()
		ln = tls.NewListener(ln, cfg)
		u.base = "https://" + ln.Addr().String()
	}
	serveConns(t, ln, func(c net.Conn, id int) {
		u.conns.Add(1)
		c.SetDeadline(time.Now().Add(20 * time.Second))
		br := bufio.NewReader(c)
		for n := 1; ; n++ {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			u.mu.Lock()
			u.seen = append(u.seen, fmt.Sprintf("c%d %s %s", id, req.Method, req.URL.Path))
			u.mu.Unlock()
			if !answer(c, br, req, id, n) {
				return
			}
		}
	})
	return u
}

func (u *adv10Upstream) url(path string) string { return u.base + path }

// requests returns what the upstream has read, in order.
func (u *adv10Upstream) requests() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.seen...)
}

// adv10Fresh answers req with a keep-alive response naming the connection,
// the request number on it and the path.
func adv10Fresh(c net.Conn, req *http.Request, conn, n int) bool {
	io.Copy(io.Discard, req.Body)
	body := fmt.Sprintf("c%d r%d %s", conn, n, req.URL.Path)
	fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	return true
}

// conf configures a Transport to trust u.
func (u *adv10Upstream) conf(extra func(*Transport)) func(*Transport) {
	return func(tr *Transport) {
		if u.roots != nil {
			tr.TLSClientConfig = &tls.Config{RootCAs: u.roots}
		}
		if extra != nil {
			extra(tr)
		}
	}
}

// refTransport is net/http's Transport for u: the reference.
func (u *adv10Upstream) refTransport(t *testing.T) *http.Transport {
	tr := &http.Transport{}
	if u.roots != nil {
		tr.TLSClientConfig = &tls.Config{RootCAs: u.roots}
	}
	t.Cleanup(tr.CloseIdleConnections)
	return tr
}

// adv10Paths runs f on the local path and through a sibling (the owner made
// the connection with /warm first), over plain TCP and TLS. mk builds the
// upstream for each run, so that connection counts start at zero.
func adv10Paths(t *testing.T, mk func(t *testing.T, withTLS bool) *adv10Upstream, f func(t *testing.T, u *adv10Upstream, rt http.RoundTripper, owner *member)) {
	for _, withTLS := range []bool{false, true} {
		name := "plain"
		if withTLS {
			name = "tls"
		}
		t.Run(name, func(t *testing.T) {
			t.Run("local", func(t *testing.T) {
				u := mk(t, withTLS)
				m := localTransportMember(t, u.conf(nil))
				warm(t, m, u.url("/warm"))
				f(t, u, m.tr, m)
			})
			t.Run("remote", func(t *testing.T) {
				u := mk(t, withTLS)
				owner, client := remotePair(t, u.conf(nil))
				warm(t, owner, u.url("/warm"))
				f(t, u, client.tr, owner)
				if s := owner.node.Stats(); s.ServedRemote == 0 {
					t.Errorf("no request of the sibling's ran on the owner's connection: %+v", s)
				}
			})
		})
	}
}

// localTransportMember is localTransport's member, with one connection per
// key: a request can only reuse it.
func localTransportMember(t *testing.T, conf func(*Transport)) *member {
	return newMember(t, testSpecLocal, func(tr *Transport) {
		tr.MaxConnsPerKey = 1
		if conf != nil {
			conf(tr)
		}
	})
}

var testSpecLocal = orbitpool.PoolSpec{Lanes: 1, Keys: 32, ResourcesPerLane: 128}

// adv10Do sends a GET (or HEAD) and reads the whole body, within 5s.
func adv10Do(t *testing.T, rt http.RoundTripper, method, url string, hdr http.Header) (*http.Response, string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	resp, err := rt.RoundTrip(req)
	if err != nil {
		return nil, "", err
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(b), err
}

// adv10Later marks, for a scripted answer that sends stray bytes a moment
// after its response, when they are out; a test waits for it before its next
// request, for an upstream that sends them later still (a busy machine)
// races that request, here as with net/http.
type adv10Later chan struct{}

func newAdv10Later() adv10Later { return make(adv10Later, 64) }

// sent records that stray bytes are out.
func (l adv10Later) sent() {
	select {
	case l <- struct{}{}:
	default:
	}
}

// wait waits for the stray bytes of an exchange that sends them (at most
// 2s), then a moment for them to arrive.
func (l adv10Later) wait(t *testing.T) {
	t.Helper()
	select {
	case <-l:
		time.Sleep(5 * time.Millisecond)
	case <-time.After(2 * time.Second):
		t.Fatal("the upstream did not send its stray bytes")
	}
}
