package caddymodule

import (
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// testDir holds the segments and sockets of this test run. Segments live as
// long as the in-process Caddy's config uses them, which can outlast the
// test that made them, so they are not in t.TempDir().
var testDir string

func TestMain(m *testing.M) {
	var err error
	testDir, err = os.MkdirTemp("", "orbit-cm-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(testDir)
	os.Exit(code)
}

var segSeq atomic.Int64

// segmentPath is a fresh segment path for t.
func segmentPath(t testing.TB) string {
	name := strings.NewReplacer("/", "_", " ", "_").Replace(t.Name())
	if len(name) > 24 {
		name = name[:24]
	}
	return filepath.Join(testDir, fmt.Sprintf("%s-%d.seg", name, segSeq.Add(1)))
}

// freePort returns a loopback port nobody listens on right now.
func freePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// upstream is a test upstream on loopback that counts its connections.
type upstream struct {
	*httptest.Server
	open     atomic.Int64 // connections open now
	maxOpen  atomic.Int64 // most connections open at once
	accepted atomic.Int64 // connections accepted in all
	requests atomic.Int64
	mu       sync.Mutex
	conns    map[net.Conn]bool
}

func newUpstream(t testing.TB, h http.Handler, tlsOn bool) *upstream {
	t.Helper()
	u := &upstream{conns: make(map[net.Conn]bool)}
	u.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.requests.Add(1)
		h.ServeHTTP(w, r)
	}))
	u.Server.Config.ConnState = func(c net.Conn, s http.ConnState) {
		u.mu.Lock()
		defer u.mu.Unlock()
		switch s {
		case http.StateNew:
			u.conns[c] = true
			u.accepted.Add(1)
			n := u.open.Add(1)
			for {
				m := u.maxOpen.Load()
				if n <= m || u.maxOpen.CompareAndSwap(m, n) {
					break
				}
			}
		case http.StateHijacked, http.StateClosed:
			if u.conns[c] {
				delete(u.conns, c)
				u.open.Add(-1)
			}
		}
	}
	if tlsOn {
		u.StartTLS()
	} else {
		u.Start()
	}
	t.Cleanup(u.Close)
	return u
}

// hostport is the upstream's address.
func (u *upstream) hostport() string {
	return strings.TrimPrefix(strings.TrimPrefix(u.URL, "http://"), "https://")
}

// waitFor polls cond until it holds or d passes.
func waitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
