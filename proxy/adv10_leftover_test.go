package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// adv10CheckOwn asserts that a response to path is the upstream's answer to
// that very request: status 200 and a body naming the path.
func adv10CheckOwn(t *testing.T, what string, resp *http.Response, body string, err error, path string) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if resp.StatusCode != 200 || !strings.HasSuffix(body, " "+path) || !strings.HasPrefix(body, "c") {
		t.Fatalf("%s: %d %q, want the upstream's answer to %s (another exchange's bytes delivered?)", what, resp.StatusCode, body, path)
	}
}

// TestAdv10HeadBodyNotReused: an upstream that answers HEAD with a
// Content-Length and then sends that many bytes anyway (in the same write,
// or a moment later in a write, and TLS record, of its own). The bytes
// belong to no request: the next request, on the local path or a sibling's
// on the owner's connection, gets its own answer, never them, as net/http's
// does.
func TestAdv10HeadBodyNotReused(t *testing.T) {
	const stray = "STRAY-HEAD-BODY"
	later := newAdv10Later()
	mk := func(t *testing.T, withTLS bool) *adv10Upstream {
		return newAdv10Upstream(t, withTLS, func(c net.Conn, br *bufio.Reader, req *http.Request, conn, n int) bool {
			switch req.URL.Path {
			case "/head-same":
				fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(stray), stray)
				return true
			case "/head-later":
				fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n", len(stray))
				time.Sleep(2 * time.Millisecond)
				io.WriteString(c, stray)
				later.sent()
				return true
			}
			return adv10Fresh(c, req, conn, n)
		})
	}
	for _, path := range []string{"/head-same", "/head-later"} {
		t.Run(path[1:], func(t *testing.T) {
			adv10Paths(t, mk, func(t *testing.T, u *adv10Upstream, rt http.RoundTripper, owner *member) {
				for round := range 3 {
					resp, body, err := adv10Do(t, rt, "HEAD", u.url(path), nil)
					if err != nil || resp.StatusCode != 200 || body != "" || resp.ContentLength != int64(len(stray)) {
						t.Fatalf("round %d: HEAD: %v %q %v", round, resp, body, err)
					}
					if path == "/head-later" {
						later.wait(t)
					}
					// The next request comes a little later, as in a proxy.
					time.Sleep(20 * time.Millisecond)
					for i := range 2 {
						resp, body, err := adv10Do(t, rt, "GET", u.url("/next"), nil)
						adv10CheckOwn(t, fmt.Sprintf("round %d, GET %d", round, i), resp, body, err, "/next")
					}
				}
				// Each HEAD cost its connection: the stray bytes were seen
				// before the next reuse.
				if n := u.conns.Load(); n != 4 {
					t.Errorf("%d upstream connections, want 4 (the warm-up's, closed with the first HEAD's stray bytes, and one per round)", n)
				}
			})
		})
	}
}

// TestAdv10RefusedUpgradeKeepsConnInStep: an upstream that refuses an
// Upgrade with an ordinary response (426, or 200) leaves an ordinary
// keep-alive connection, which net/http reuses: so does orbit, locally and
// for a sibling, and the next request gets its own answer. One that refuses
// and then speaks the new protocol anyway (bytes after the refusal) loses
// its connection, and those bytes reach nobody.
func TestAdv10RefusedUpgradeKeepsConnInStep(t *testing.T) {
	later := newAdv10Later()
	mk := func(t *testing.T, withTLS bool) *adv10Upstream {
		return newAdv10Upstream(t, withTLS, func(c net.Conn, br *bufio.Reader, req *http.Request, conn, n int) bool {
			switch req.URL.Path {
			case "/ws-426":
				io.WriteString(c, "HTTP/1.1 426 Upgrade Required\r\nContent-Length: 4\r\n\r\nnope")
				return true
			case "/ws-200":
				io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nno")
				return true
			case "/ws-200-then-tunnel":
				io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nno")
				time.Sleep(2 * time.Millisecond)
				io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 13\r\n\r\nTUNNEL-FRAME!")
				later.sent()
				return true
			}
			return adv10Fresh(c, req, conn, n)
		})
	}
	up := http.Header{"Upgrade": {"echo"}, "Connection": {"Upgrade"}}
	for _, tc := range []struct {
		path   string
		status int
		conns  int32 // upstream connections after warm-up, refusal, two GETs
	}{
		{"/ws-426", 426, 1},
		{"/ws-200", 200, 1},
		{"/ws-200-then-tunnel", 200, 2},
	} {
		t.Run(tc.path[1:], func(t *testing.T) {
			adv10Paths(t, mk, func(t *testing.T, u *adv10Upstream, rt http.RoundTripper, owner *member) {
				resp, _, err := adv10Do(t, rt, "GET", u.url(tc.path), up)
				if err != nil || resp.StatusCode != tc.status {
					t.Fatalf("refused upgrade: %v %v", resp, err)
				}
				if _, ok := resp.Body.(io.Writer); ok {
					t.Fatalf("a refused upgrade's body is writable")
				}
				if tc.path == "/ws-200-then-tunnel" {
					later.wait(t)
				}
				time.Sleep(20 * time.Millisecond)
				for i := range 2 {
					resp, body, err := adv10Do(t, rt, "GET", u.url("/next"), nil)
					adv10CheckOwn(t, fmt.Sprintf("GET %d", i), resp, body, err, "/next")
				}
				if n := u.conns.Load(); n != tc.conns {
					t.Errorf("%d upstream connections, want %d", n, tc.conns)
				}
			})
		})
	}
	// The reference: net/http keeps the connection after a plain refusal.
	u := mk(t, false)
	ref := u.refTransport(t)
	c := &http.Client{Transport: ref}
	for _, p := range []string{"/warm", "/ws-426", "/next"} {
		req, _ := http.NewRequest("GET", u.url(p), nil)
		if p != "/warm" {
			req.Header = up.Clone()
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.ReadAll(resp.Body)
		resp.Body.Close()
	}
	if n := u.conns.Load(); n != 1 {
		t.Fatalf("net/http used %d connections for a refused upgrade and the next request; the test's premise is 1", n)
	}
}

// TestAdv10UpgradeGreetingInHeadWrite: an upstream that switches protocols
// and speaks first, in the same write (and TLS record) as its 101 head, as
// a WebSocket server sending a message at once does. The greeting is the
// tunnel's first bytes, once, locally and through a sibling (where both the
// owner's head reader and the sibling's may have buffered it); the
// connection leaves the pool and the next request gets its own answer.
func TestAdv10UpgradeGreetingInHeadWrite(t *testing.T) {
	mk := func(t *testing.T, withTLS bool) *adv10Upstream {
		return newAdv10Upstream(t, withTLS, func(c net.Conn, br *bufio.Reader, req *http.Request, conn, n int) bool {
			if req.URL.Path != "/up" {
				return adv10Fresh(c, req, conn, n)
			}
			io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\nHELLO|")
			io.Copy(c, br)
			io.WriteString(c, "|bye")
			return false
		})
	}
	adv10Paths(t, mk, func(t *testing.T, u *adv10Upstream, rt http.RoundTripper, owner *member) {
		req, _ := http.NewRequest("GET", u.url("/up"), nil)
		req.Header.Set("Upgrade", "echo")
		req.Header.Set("Connection", "Upgrade")
		resp, err := rt.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != 101 {
			t.Fatalf("status %d", resp.StatusCode)
		}
		rw := resp.Body.(io.ReadWriteCloser)
		got, err := readWithTimeout(rw, len("HELLO|"), 2*time.Second)
		if err != nil || got != "HELLO|" {
			t.Fatalf("greeting: %q %v", got, err)
		}
		io.WriteString(rw, "ping")
		resp.Body.(interface{ CloseWrite() error }).CloseWrite()
		done := make(chan struct{})
		var rest []byte
		go func() {
			defer close(done)
			rest, err = io.ReadAll(rw)
		}()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			rw.Close()
			<-done
			t.Fatal("tunnel did not end")
		}
		if err != nil || string(rest) != "ping|bye" {
			t.Fatalf("tunnel after the greeting: %q %v", rest, err)
		}
		waitFor(t, 2*time.Second, "the upgraded connection to leave the pool", func() bool {
			return owner.node.Stats().OpenConns == 0
		})
		resp2, body, err := adv10Do(t, rt, "GET", u.url("/next"), nil)
		adv10CheckOwn(t, "GET after the tunnel", resp2, body, err, "/next")
		if n := u.conns.Load(); n != 2 {
			t.Errorf("%d upstream connections, want 2", n)
		}
	})
}
