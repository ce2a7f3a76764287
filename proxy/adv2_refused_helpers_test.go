package proxy

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/internal/sockdiag"
)

// adv2Upstream is a plain HTTP/1.1 upstream with no connection cap of its
// own. /drop* closes the connection at once without an answer (a "return
// 444" rule, a blocked client, a crashing worker), /slowdrop after working
// on the request for 500ms; /hold* reads the request and works on it for
// holdFor without reading the connection further (a busy handler: a client
// that gives up leaves an orphan here until it ends); /stream answers an
// endless stream of 4 KiB chunks until a write fails;
// /trickle answers a chunked stream of a few bytes every 100ms, forever,
// ignoring the client's FIN (an SSE feed with heartbeats that notices a
// gone client only when a write fails); anything else is answered "ok".
type adv2Upstream struct {
	url      string
	addr     netip.AddrPort
	conns    atomic.Int64
	requests sync.Map // path -> *atomic.Int64
	holdFor  time.Duration
}

func (u *adv2Upstream) count(path string) int64 {
	v, _ := u.requests.LoadOrStore(path, new(atomic.Int64))
	return v.(*atomic.Int64).Load()
}

func startAdv2Upstream(t *testing.T, holdFor time.Duration) *adv2Upstream {
	t.Helper()
	u := &adv2Upstream{holdFor: holdFor}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var all []net.Conn
	t.Cleanup(func() {
		close(stop)
		ln.Close()
		mu.Lock()
		for _, c := range all {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u.conns.Add(1)
			mu.Lock()
			all = append(all, c)
			mu.Unlock()
			wg.Go(func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					v, _ := u.requests.LoadOrStore(req.URL.Path, new(atomic.Int64))
					v.(*atomic.Int64).Add(1)
					io.Copy(io.Discard, req.Body)
					switch {
					case strings.HasPrefix(req.URL.Path, "/drop"):
						return
					case strings.HasPrefix(req.URL.Path, "/hold"):
						select {
						case <-time.After(u.holdFor):
						case <-stop:
						}
						return
					case req.URL.Path == "/slowdrop":
						time.Sleep(500 * time.Millisecond)
						return
					case req.URL.Path == "/stream":
						io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
						chunk := "1000\r\n" + strings.Repeat("x", 4096) + "\r\n"
						for {
							if _, err := io.WriteString(c, chunk); err != nil {
								return
							}
							time.Sleep(200 * time.Microsecond)
						}
					case req.URL.Path == "/trickle":
						io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
						for {
							if _, err := io.WriteString(c, "c\r\n: heartbeat\n\r\n"); err != nil {
								return
							}
							select {
							case <-time.After(100 * time.Millisecond):
							case <-stop:
								return
							}
						}
					}
					io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
				}
			})
		}
	})
	u.addr = ln.Addr().(*net.TCPAddr).AddrPort()
	u.url = "http://" + ln.Addr().String()
	return u
}

// adv2ForeignOrphan leaves one orphan to u as another process of the same
// user would (a health checker, curl, another app): it sends a /hold
// request and closes its end while the upstream is busy with it. It waits
// until the kernel counts it.
func adv2ForeignOrphan(t *testing.T, u *adv2Upstream) {
	t.Helper()
	c, err := net.Dial("tcp", u.addr.String())
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(c, "GET /hold-foreign HTTP/1.1\r\nHost: x\r\n\r\n")
	for deadline := time.Now().Add(2 * time.Second); u.count("/hold-foreign") < 1; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the upstream did not read the foreign request")
		}
	}
	c.Close()
	adv2WaitOrphans(t, u, 1)
}

func adv2WaitOrphans(t *testing.T, u *adv2Upstream, want int) {
	t.Helper()
	var got int
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if got, _ = sockdiag.Orphans([]netip.AddrPort{u.addr}); got >= want {
			return
		}
	}
	t.Fatalf("orphans to the upstream: %d, want %d", got, want)
}
