package proxy

import (
	"bytes"
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

	"github.com/orbitproxy/orbit/internal/grpcmsg"
	"golang.org/x/net/http2"
)

// tlsUpstream is an https test upstream that offers h2 by ALPN (or only
// http/1.1) and records the protocol of every request and its connections.
type tlsUpstream struct {
	ts     *httptest.Server
	url    string
	conns  atomic.Int64
	mu     sync.Mutex
	protos map[string]int // "HTTP/2.0 h2", "HTTP/1.1 http/1.1", ...
}

func newTLSUpstream(t testing.TB, h2 bool, maxStreams uint32) *tlsUpstream {
	t.Helper()
	u := &tlsUpstream{protos: map[string]int{}}
	u.ts = httptest.NewUnstartedServer(http.HandlerFunc(u.serve))
	u.ts.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			u.conns.Add(1)
		}
	}
	if h2 {
		u.ts.EnableHTTP2 = true
		if err := http2.ConfigureServer(u.ts.Config, &http2.Server{MaxConcurrentStreams: maxStreams}); err != nil {
			t.Fatal(err)
		}
	}
	u.ts.StartTLS()
	if !h2 {
		// What the server offers: http/1.1 only.
		if got := u.ts.TLS.NextProtos; len(got) != 1 || got[0] != "http/1.1" {
			t.Fatalf("upstream offers %v, want http/1.1 only", got)
		}
	}
	u.url = u.ts.URL
	t.Cleanup(u.ts.Close)
	return u
}

func (u *tlsUpstream) serve(w http.ResponseWriter, r *http.Request) {
	u.mu.Lock()
	u.protos[r.Proto+" "+r.TLS.NegotiatedProtocol]++
	u.mu.Unlock()
	w.Header().Set("Content-Type", "application/grpc")
	w.Header().Set("Trailer", "Grpc-Status")
	w.WriteHeader(http.StatusOK)
	grpcmsg.Echo(w, w.(http.Flusher).Flush, r.Body, 0)
	w.Header().Set("Grpc-Status", "0")
}

func (u *tlsUpstream) seen() map[string]int {
	u.mu.Lock()
	defer u.mu.Unlock()
	m := map[string]int{}
	for k, v := range u.protos {
		m[k] = v
	}
	return m
}

func tlsConf(u *tlsUpstream) func(*Transport) {
	roots := x509.NewCertPool()
	roots.AddCert(u.ts.Certificate())
	return func(tr *Transport) {
		tr.HTTP2 = true
		tr.TLSClientConfig = &tls.Config{RootCAs: roots}
	}
}

// echoOnce sends one message and checks it comes back with grpc-status 0.
func echoOnce(t testing.TB, m *member, url, msg string) *http.Response {
	t.Helper()
	resp, err := m.tr.RoundTrip(grpcReq(t, context.Background(), url+"/echo", bytes.NewReader(grpcmsg.Frame([]byte(msg)))))
	if err != nil {
		t.Fatal(err)
	}
	p, err := grpcmsg.Read(resp.Body)
	if err != nil || string(p) != msg {
		t.Fatalf("message %q, %v; want %q", p, err, msg)
	}
	drain(resp)
	if resp.Trailer.Get("Grpc-Status") != "0" {
		t.Fatalf("trailers %v", resp.Trailer)
	}
	return resp
}

// TestH2TLSLocalAndRemote: an https upstream that offers h2 by ALPN gets
// HTTP/2 from both members on one connection, registered with the stream
// limit it announced over TLS, and a bidirectional stream works through the
// sibling.
func TestH2TLSLocalAndRemote(t *testing.T) {
	up := newTLSUpstream(t, true, 5)
	owner, client := remotePair(t, tlsConf(up))
	for i, m := range []*member{owner, client, owner, client} {
		resp := echoOnce(t, m, up.url, fmt.Sprint("m", i))
		if resp.ProtoMajor != 2 {
			t.Fatalf("request %d: %s, want HTTP/2.0", i, resp.Proto)
		}
		if m == owner && (resp.TLS == nil || resp.TLS.NegotiatedProtocol != "h2") {
			t.Fatalf("request %d on the owner: TLS %+v, want the connection's state with ALPN h2", i, resp.TLS)
		}
	}
	c, _ := owner.pool.Candidates(mustKey(t, owner.tr, up.url), nil)
	if len(c) != 1 || c[0].Capacity != 5 {
		t.Fatalf("candidates %+v: want one connection with the announced 5 streams", c)
	}

	pr, pw := io.Pipe()
	req := grpcReq(t, context.Background(), up.url+"/echo", pr)
	got, errc := headAsync(client.tr, req)
	if _, err := pw.Write(grpcmsg.Frame([]byte("b0"))); err != nil {
		t.Fatal(err)
	}
	var resp *http.Response
	select {
	case resp = <-got:
	case err := <-errc:
		t.Fatal(err)
	case <-time.After(10 * time.Second):
		t.Fatal("no response head while the request streams")
	}
	for i := range 10 {
		if i > 0 {
			pw.Write(grpcmsg.Frame([]byte(fmt.Sprint("b", i))))
		}
		if p, err := grpcmsg.Read(resp.Body); err != nil || string(p) != fmt.Sprint("b", i) {
			t.Fatalf("bidi message %d: %q, %v", i, p, err)
		}
	}
	pw.Close()
	drain(resp)
	if resp.Trailer.Get("Grpc-Status") != "0" {
		t.Fatalf("bidi trailers %v", resp.Trailer)
	}

	if n := up.conns.Load(); n != 1 {
		t.Fatalf("upstream saw %d connections, want 1", n)
	}
	if s := up.seen(); len(s) != 1 || s["HTTP/2.0 h2"] != 5 {
		t.Fatalf("upstream saw %v, want 5 HTTP/2 requests over ALPN h2", s)
	}
	if s := client.node.Stats(); s.ReusedRemote != 3 || s.Created != 0 {
		t.Fatalf("client stats %+v: want 3 remote uses and no connection of its own", s)
	}
}

// TestH2TLSFallsBackToHTTP1: an https upstream that offers only http/1.1
// gets HTTP/1.1 from a transport that offers h2, locally and through a
// sibling, on a connection pooled with capacity 1.
func TestH2TLSFallsBackToHTTP1(t *testing.T) {
	up := newTLSUpstream(t, false, 0)
	owner, client := remotePair(t, tlsConf(up))
	for i, m := range []*member{owner, client, owner, client} {
		resp := echoOnce(t, m, up.url, fmt.Sprint("m", i))
		if resp.ProtoMajor != 1 {
			t.Fatalf("request %d: %s, want HTTP/1.1", i, resp.Proto)
		}
	}
	c, _ := owner.pool.Candidates(mustKey(t, owner.tr, up.url), nil)
	if len(c) != 1 || c[0].Capacity != 1 {
		t.Fatalf("candidates %+v: want one HTTP/1.1 connection, capacity 1", c)
	}
	if s := up.seen(); len(s) != 1 || s["HTTP/1.1 http/1.1"] != 4 {
		t.Fatalf("upstream saw %v, want 4 HTTP/1.1 requests over ALPN http/1.1", s)
	}
	if n := up.conns.Load(); n != 1 {
		t.Fatalf("upstream saw %d connections, want 1", n)
	}
	if s := client.node.Stats(); s.ReusedRemote != 2 || s.Created != 0 {
		t.Fatalf("client stats %+v: want 2 remote uses", s)
	}
}
