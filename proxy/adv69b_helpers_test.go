package proxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/orbitpool"
)

// adv69bSpec is a one-process table with room for two connections.
var adv69bSpec = orbitpool.PoolSpec{Lanes: 1, Keys: 4, ResourcesPerLane: 2}

// adv69bUpstream is a scripted upstream, plain or TLS, recording every
// connection it accepted so a test can see which are still open. answer is
// as rawUpstream's.
type adv69bUpstream struct {
	url   string
	mu    sync.Mutex
	conns []*adv69bConn
}

type adv69bConn struct {
	net.Conn
	closed chan struct{} // closed once the peer (the proxy) closed it
}

func newAdv69bUpstream(t *testing.T, useTLS bool, answer func(c net.Conn, br *bufio.Reader, req *http.Request) bool) (*adv69bUpstream, *tls.Config) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := &adv69bUpstream{url: "http://" + ln.Addr().String()}
	var cc *tls.Config
	var sc *tls.Config
	if useTLS {
		ts := httptest.NewUnstartedServer(http.NotFoundHandler())
		ts.StartTLS()
		cert := ts.TLS.Certificates[0]
		roots := x509.NewCertPool()
		roots.AddCert(ts.Certificate())
		ts.Close()
		sc = &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"http/1.1"}}
		cc = &tls.Config{RootCAs: roots, ServerName: "example.com"}
		u.url = "https://" + ln.Addr().String()
	}
	t.Cleanup(func() {
		ln.Close()
		u.mu.Lock()
		defer u.mu.Unlock()
		for _, c := range u.conns {
			c.Close()
		}
	})
	go func() {
		for {
			raw, err := ln.Accept()
			if err != nil {
				return
			}
			var c net.Conn = raw
			if sc != nil {
				c = tls.Server(raw, sc)
			}
			ac := &adv69bConn{Conn: c, closed: make(chan struct{})}
			u.mu.Lock()
			u.conns = append(u.conns, ac)
			u.mu.Unlock()
			go func() {
				br := bufio.NewReader(c)
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						close(ac.closed)
						return
					}
					if !answer(c, br, req) {
						// Wait for the proxy to close (or the test to end).
						c.SetReadDeadline(time.Now().Add(3 * time.Second))
						io.Copy(io.Discard, br)
						close(ac.closed)
						return
					}
				}
			}()
		}
	}()
	return u, cc
}

// open is how many of the upstream's connections the proxy has not closed.
func (u *adv69bUpstream) open() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	n := 0
	for _, c := range u.conns {
		select {
		case <-c.closed:
		default:
			n++
		}
	}
	return n
}

func (u *adv69bUpstream) accepted() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.conns)
}

// adv69bAnswer is a common script: /stream holds a chunked body until
// release is closed; /conn answers the client's address; /stray answers
// "ok" and a second response in the same write; /head answers a HEAD with
// a Content-Length and then sends that many bytes; /close answers with
// Connection: close and leaves the connection open; /drop answers then
// closes; /dropnext answers once, and closes the connection at its next
// request unanswered; /big answers a 40 KiB body followed by a stray
// response in the same write; anything else "ok".
func adv69bAnswer(release chan struct{}) func(c net.Conn, br *bufio.Reader, req *http.Request) bool {
	var mu sync.Mutex
	seen := map[net.Conn]int{}
	return func(c net.Conn, br *bufio.Reader, req *http.Request) bool {
		mu.Lock()
		seen[c]++
		nth := seen[c]
		mu.Unlock()
		io.Copy(io.Discard, req.Body)
		switch req.URL.Path {
		case "/stream":
			io.WriteString(c, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n")
			<-release
			io.WriteString(c, "0\r\n\r\n")
			return true
		case "/conn":
			a := c.RemoteAddr().String()
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: "+strconv.Itoa(len(a))+"\r\n\r\n"+a)
			return true
		case "/stray":
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokHTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nEVIL!")
			return true
		case "/head":
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nEVIL!")
			return true
		case "/204":
			io.WriteString(c, "HTTP/1.1 204 No Content\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nEVIL!")
			return true
		case "/big":
			body := strings.Repeat("b", 40<<10)
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: "+strconv.Itoa(len(body))+"\r\n\r\n"+body+"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nEVIL!")
			return true
		case "/close":
			io.WriteString(c, "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok")
			return true
		case "/drop":
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
			c.Close()
			return false
		case "/dropnext":
			if nth > 1 {
				c.Close()
				return false
			}
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
			return true
		}
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		return true
	}
}

// adv69bDo sends method to url with body (nil for none) within 5s and reads
// the whole response.
func adv69bDo(t *testing.T, tr *Transport, method, url, body string) (*http.Response, string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := tr.RoundTrip(req)
	if err != nil {
		return nil, "", err
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(b), err
}

// adv69bHold starts n /stream exchanges, holding a connection each until
// release is closed; it returns a func that drains them.
func adv69bHold(t *testing.T, tr *Transport, url string, n int) func() {
	t.Helper()
	var held []*http.Response
	for range n {
		req, _ := http.NewRequest("GET", url+"/stream", nil)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			for _, r := range held {
				r.Body.Close()
			}
			t.Fatalf("a stream: %v", err)
		}
		held = append(held, resp)
	}
	var once sync.Once
	drainAll := func() {
		once.Do(func() {
			for _, r := range held {
				drain(r)
			}
		})
	}
	t.Cleanup(drainAll)
	return drainAll
}

type (
	netConn     = net.Conn
	bufioReader = *bufio.Reader
)
