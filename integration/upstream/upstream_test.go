package upstream

import (
	"bufio"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

func start(t *testing.T, o Options) *Server {
	t.Helper()
	s, err := Start(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// getConcurrently sends n GETs to url at once and reads their bodies.
func getConcurrently(t *testing.T, c *http.Client, url string, n int) {
	t.Helper()
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			resp, err := c.Get(url)
			if err != nil {
				t.Error(err)
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		})
	}
	wg.Wait()
}

func TestCountsConnectionsAndRequests(t *testing.T) {
	s := start(t, Options{})
	// Idle room for all three, or net/http closes the third as it comes
	// back idle and dials again: more than 3 accepted, none at fault here.
	c := &http.Client{Transport: &http.Transport{MaxConnsPerHost: 3, MaxIdleConnsPerHost: 3}}
	defer c.CloseIdleConnections()
	getConcurrently(t, c, s.URL+"/", 30)
	st := s.Stats()
	if st.Requests != 30 || st.Accepted < 1 || st.Accepted > 3 || st.Peak > st.Accepted || st.Refused != 0 {
		t.Fatalf("stats %+v: want 30 requests over at most 3 connections", st)
	}
	c.CloseIdleConnections()
	deadline := time.Now().Add(5 * time.Second)
	for s.Stats().Open != 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if st := s.Stats(); st.Open != 0 {
		t.Fatalf("open %d after the client closed everything", st.Open)
	}
}

func TestRefusesBeyondCap(t *testing.T) {
	s := start(t, Options{MaxConns: 2})
	var conns []net.Conn
	for range 2 {
		c, err := net.Dial("tcp", s.Addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		conns = append(conns, c)
	}
	// Make sure both are accepted before the third arrives.
	for _, c := range conns {
		io.WriteString(c, "GET /status?code=204 HTTP/1.1\r\nHost: x\r\n\r\n")
		if _, err := http.ReadResponse(bufio.NewReader(c), nil); err != nil {
			t.Fatal(err)
		}
	}
	third, err := net.Dial("tcp", s.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer third.Close()
	third.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := third.Read(make([]byte, 1)); err == nil || n != 0 {
		t.Fatalf("third connection over a cap of 2 was served")
	}
	if st := s.Stats(); st.Refused != 1 || st.Accepted != 2 || st.Peak != 2 {
		t.Fatalf("stats %+v", st)
	}
}

func TestTLSHandshakesAndResumption(t *testing.T) {
	s := start(t, Options{TLS: true})
	cache := tls.NewLRUClientSessionCache(8)
	for range 3 {
		tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: s.CertPool, ClientSessionCache: cache}}
		resp, err := (&http.Client{Transport: tr}).Get(s.URL + "/")
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		tr.CloseIdleConnections()
	}
	if st := s.Stats(); st.Handshakes != 3 || st.Resumed != 2 {
		t.Fatalf("stats %+v: want 3 handshakes, 2 resumed", st)
	}
}

func TestRoutes(t *testing.T) {
	s := start(t, Options{})
	get := func(path string, body io.Reader) (*http.Response, string) {
		method := "GET"
		if body != nil {
			method = "POST"
		}
		req, _ := http.NewRequest(method, s.URL+path, body)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	if _, b := get("/bytes?n=1000", nil); len(b) != 1000 {
		t.Errorf("/bytes: %d bytes", len(b))
	}
	if _, b := get("/echo", strings.NewReader("ping")); b != "ping" {
		t.Errorf("/echo: %q", b)
	}
	if _, b := get("/stream?n=3&gap=1ms", nil); b != "chunk 0\nchunk 1\nchunk 2\n" {
		t.Errorf("/stream: %q", b)
	}
	if r, _ := get("/status?code=503", nil); r.StatusCode != 503 {
		t.Errorf("/status: %d", r.StatusCode)
	}
}

func TestWebSocketEcho(t *testing.T) {
	s := start(t, Options{})
	c, err := net.Dial("tcp", s.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, "GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	io.WriteString(c, "hello")
	c.(*net.TCPConn).CloseWrite()
	b, _ := io.ReadAll(br)
	if string(b) != "hello" {
		t.Fatalf("echo %q", b)
	}
}

// TestBusyIsTimeInHandlers: Busy sums the time requests spent in the
// handlers, concurrent ones each counted.
func TestBusyIsTimeInHandlers(t *testing.T) {
	const delay = 20 * time.Millisecond
	s := start(t, Options{Delay: delay})
	c := &http.Client{Transport: &http.Transport{}}
	defer c.CloseIdleConnections()
	getConcurrently(t, c, s.URL+"/", 3)
	if got := s.Stats().Busy; got < 3*delay || got > 3*delay+2*time.Second {
		t.Errorf("busy %v after 3 requests of %v each", got, delay)
	}
}

// TestGatherHoldsUntilEnoughInProgress: with Gather, no call answers until
// that many were in progress at once, and then every one does; a call that
// never sees them answers after GatherWait.
func TestGatherHoldsUntilEnoughInProgress(t *testing.T) {
	s := start(t, Options{Gather: 4, GatherWait: time.Minute})
	c := &http.Client{Transport: &http.Transport{}}
	defer c.CloseIdleConnections()
	done := make(chan struct{}, 4)
	get := func() {
		resp, err := c.Get(s.URL + "/")
		if err != nil {
			t.Error(err)
		} else {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		done <- struct{}{}
	}
	for range 3 {
		go get()
	}
	for s.Stats().Streams < 3 {
		time.Sleep(time.Millisecond)
	}
	select {
	case <-done:
		t.Fatal("a call answered with 3 of 4 in progress")
	case <-time.After(100 * time.Millisecond):
	}
	go get()
	for range 4 {
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("calls still held 10s after the fourth arrived")
		}
	}
	if p := s.Stats().PeakStreams; p != 4 {
		t.Errorf("peak %d in progress, want 4", p)
	}

	alone := start(t, Options{Gather: 4, GatherWait: 50 * time.Millisecond})
	begin := time.Now()
	getConcurrently(t, c, alone.URL+"/", 1)
	if d := time.Since(begin); d < 50*time.Millisecond {
		t.Errorf("a lone call answered after %v, before GatherWait", d)
	}
}
