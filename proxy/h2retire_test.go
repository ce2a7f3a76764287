package proxy

import (
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
)

// slowCloseListener hands out connections that the server closes late: a
// Close waits delay before it closes the socket. It records when each
// connection was accepted and when it was closed.
type slowCloseListener struct {
	net.Listener
	delay time.Duration

	mu       sync.Mutex
	accepted []time.Time
	closed   []time.Time
}

func (l *slowCloseListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	l.accepted = append(l.accepted, time.Now())
	l.mu.Unlock()
	return &slowCloseConn{Conn: c, l: l}, nil
}

type slowCloseConn struct {
	net.Conn
	l    *slowCloseListener
	once sync.Once
}

func (c *slowCloseConn) Close() error {
	c.once.Do(func() {
		time.Sleep(c.l.delay)
		c.l.mu.Lock()
		c.l.closed = append(c.l.closed, time.Now())
		c.l.mu.Unlock()
	})
	return c.Conn.Close()
}

// TestH2RetiredInOrder: an HTTP/2 connection that leaves the pool by policy
// (a drain, its idle timeout) keeps its unit of the key's budget until the
// upstream has closed its side, as an HTTP/1.1 one does (retireInOrder): an
// upstream that caps its connections counts it until then, and a
// replacement dialed at once would find the cap full. The upstream here
// closes 150ms after the client; the key's budget must not show the unit
// back before that, and a request waiting for it gets a new connection only
// once the old one is closed at the upstream.
func TestH2RetiredInOrder(t *testing.T) {
	const delay = 150 * time.Millisecond
	for _, tlsOn := range []bool{false, true} {
		for _, how := range []string{"drain", "idle timeout"} {
			t.Run(fmt.Sprintf("tls=%v/%s", tlsOn, how), func(t *testing.T) {
				testH2RetiredInOrder(t, tlsOn, how, delay)
			})
		}
	}
}

func testH2RetiredInOrder(t *testing.T, tlsOn bool, how string, delay time.Duration) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sl := &slowCloseListener{Listener: ln, delay: delay}
	ts := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ok")
	}))
	ts.Listener.Close()
	ts.Listener = sl
	var conf func(*Transport)
	if tlsOn {
		ts.EnableHTTP2 = true
		ts.StartTLS()
		roots := x509.NewCertPool()
		roots.AddCert(ts.Certificate())
		conf = func(tr *Transport) {
			tr.HTTP2 = true
			tr.TLSClientConfig = &tls.Config{RootCAs: roots}
		}
	} else {
		var p http.Protocols
		p.SetUnencryptedHTTP2(true)
		ts.Config.Protocols = &p
		ts.Start()
		conf = h2cConf
	}
	t.Cleanup(ts.Close)
	url := ts.URL + "/"

	m := newMember(t, testSpec, func(tr *Transport) {
		conf(tr)
		tr.MaxConnsPerKey = 1
		if how == "idle timeout" {
			tr.IdleConnTimeout = 100 * time.Millisecond
		}
	})
	if err := getOK(m, t.Context(), url); err != nil {
		t.Fatal(err)
	}
	key := mustKey(t, m.tr, url)
	first, _ := m.pool.Candidates(key, nil)
	if len(first) != 1 || first[0].Capacity < 2 {
		t.Fatalf("registered %+v, want one HTTP/2 connection", first)
	}
	registered := func() bool {
		c, _ := m.pool.Candidates(key, nil)
		for _, r := range c {
			if r.ID == first[0].ID {
				return true
			}
		}
		return false
	}
	var second atomic.Value
	done := make(chan struct{})
	if how == "drain" {
		m.tr.CloseIdleConnections()
		go func() {
			defer close(done)
			if err := getOK(m, t.Context(), url); err != nil {
				second.Store(err)
			}
		}()
	}
	deadline := time.Now().Add(5 * time.Second)
	for registered() {
		if time.Now().After(deadline) {
			t.Fatal("the connection never left the pool")
		}
		time.Sleep(time.Millisecond)
	}
	unitBack := time.Now()
	sl.mu.Lock()
	closedAt := append([]time.Time(nil), sl.closed...)
	sl.mu.Unlock()
	if len(closedAt) == 0 || unitBack.Before(closedAt[0]) {
		t.Fatalf("the unit came back before the upstream closed the connection (closed: %v)", closedAt)
	}
	if how == "drain" {
		<-done
		if err, _ := second.Load().(error); err != nil {
			t.Fatalf("the request that waited for the unit: %v", err)
		}
		sl.mu.Lock()
		defer sl.mu.Unlock()
		if len(sl.accepted) != 2 || sl.accepted[1].Before(sl.closed[0]) {
			t.Fatalf("the replacement was accepted before the upstream closed the first connection: accepted %v, closed %v", sl.accepted, sl.closed)
		}
	}
}
