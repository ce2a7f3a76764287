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

	"github.com/caddyserver/caddy/v2/caddytest"
	"github.com/orbitproxy/orbit/internal/freeport"
)

// testDir holds the segments and sockets of this test run. Segments live as
// long as the in-process Caddy's config uses them, which can outlast the
// test that made them, so they are not in t.TempDir().
var testDir string

// adminAddr is the in-process Caddy's admin endpoint: a port free when the
// run began, so that two runs on one host do not reach each other's Caddy,
// and outside the ephemeral range (freeport), so that the run's own
// outgoing connections leave it free for every config load.
var adminAddr string

func TestMain(m *testing.M) {
	var err error
	testDir, err = os.MkdirTemp("", "orbit-cm-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	caddytest.Default.AdminPort, err = freeport.Pick()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	adminAddr = fmt.Sprintf("localhost:%d", caddytest.Default.AdminPort)
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

// freePort returns a port nobody listens on right now, outside the
// ephemeral range (freeport), and not returned before in this run.
func freePort(t testing.TB) int {
	t.Helper()
	portsMu.Lock()
	defer portsMu.Unlock()
	for {
		port, err := freeport.Pick()
		if err != nil {
			t.Fatal(err)
		}
		// The kernel may give a port it just freed again: two sites of
		// one test on the same port make an ambiguous Caddyfile.
		if !portsGiven[port] {
			portsGiven[port] = true
			return port
		}
	}
}

// portsGiven is every port freePort returned in this run.
var (
	portsMu    sync.Mutex
	portsGiven = make(map[int]bool)
)

// upstream is a test upstream on loopback that counts its connections. A
// connection stops counting as open just before its socket closes, not in a
// ConnState hook after it: a client that dials a replacement the moment it
// reads the close would otherwise be counted with the old one still open.
type upstream struct {
	*httptest.Server
	open     atomic.Int64 // connections open now
	maxOpen  atomic.Int64 // most connections open at once
	accepted atomic.Int64 // connections accepted in all
	requests atomic.Int64
}

func newUpstream(t testing.TB, h http.Handler, tlsOn bool) *upstream {
	t.Helper()
	u := &upstream{}
	u.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.requests.Add(1)
		h.ServeHTTP(w, r)
	}))
	u.Server.Listener = &countingListener{Listener: u.Server.Listener, u: u}
	if tlsOn {
		u.StartTLS()
	} else {
		u.Start()
	}
	t.Cleanup(u.Close)
	return u
}

type countingListener struct {
	net.Listener
	u *upstream
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.u.accepted.Add(1)
	n := l.u.open.Add(1)
	for m := l.u.maxOpen.Load(); n > m && !l.u.maxOpen.CompareAndSwap(m, n); m = l.u.maxOpen.Load() {
	}
	return &countedConn{Conn: c, open: &l.u.open}, nil
}

type countedConn struct {
	net.Conn
	once sync.Once
	open *atomic.Int64
}

func (c *countedConn) Close() error {
	c.once.Do(func() { c.open.Add(-1) })
	return c.Conn.Close()
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
