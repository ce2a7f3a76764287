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
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/internal/grpcmsg"
)

// TestAdv11H2RetireUnderLoad: HTTP/2 connections retire in good order while
// streams keep starting on them, from the owner and from a sibling through
// it: the idle timeout (1ms, so every gap between streams ends a
// connection at the next sweep) and CloseIdleConnections every 2ms. A
// stream that starts as its connection retires is refused retry-safe and
// sent again: no request fails. Once the load stops every connection leaves
// the pool, and the goroutines and descriptors of the retirements are gone.
func TestAdv11H2RetireUnderLoad(t *testing.T) {
	t.Run("h2c", func(t *testing.T) {
		up := newH2Upstream(t, 100)
		defer func() { t.Logf("%d connections dialed", up.conns.Load()) }()
		adv11RetireUnderLoad(t, up.url, up.ln.Addr().String(), h2cConf, func(m *member) error {
			req := grpcReq(t, context.Background(), up.url+"/unary", bytes.NewReader(grpcmsg.Frame([]byte("hello"))))
			resp, err := m.tr.RoundTrip(req)
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			p, err := grpcmsg.Read(resp.Body)
			if err == nil && string(p) != "hello" {
				err = errString("echoed " + string(p))
			}
			return err
		})
	})
	t.Run("tls", func(t *testing.T) {
		ts := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			if r.ProtoMajor != 2 {
				http.Error(w, "want HTTP/2", http.StatusHTTPVersionNotSupported)
				return
			}
			w.Write(b)
		}))
		var conns atomic.Int64
		ts.Config.ConnState = func(_ net.Conn, st http.ConnState) {
			if st == http.StateNew {
				conns.Add(1)
			}
		}
		ts.EnableHTTP2 = true
		ts.StartTLS()
		defer func() { t.Logf("%d connections dialed", conns.Load()) }()
		t.Cleanup(ts.Close)
		roots := x509.NewCertPool()
		roots.AddCert(ts.Certificate())
		conf := func(tr *Transport) {
			tr.HTTP2 = true
			tr.TLSClientConfig = &tls.Config{RootCAs: roots}
		}
		adv11RetireUnderLoad(t, ts.URL, ts.Listener.Addr().String(), conf, func(m *member) error {
			req, err := http.NewRequest("POST", ts.URL+"/", strings.NewReader("hello"))
			if err != nil {
				return err
			}
			resp, err := m.tr.RoundTrip(req)
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			if err == nil && (resp.StatusCode != 200 || string(b) != "hello") {
				err = errString(fmt.Sprintf("%s %d %q", resp.Proto, resp.StatusCode, b))
			}
			return err
		})
	})
}

func adv11RetireUnderLoad(t *testing.T, url, addr string, conf func(*Transport), do func(*member) error) {
	owner, client := remotePair(t, func(tr *Transport) {
		conf(tr)
		tr.IdleConnTimeout = time.Millisecond
	})
	key := mustKey(t, owner.tr, url)

	ctx, cancel := context.WithTimeout(t.Context(), 1500*time.Millisecond)
	defer cancel()
	var wg sync.WaitGroup
	var ok, failed atomic.Int64
	var firstErr atomic.Value
	for i := range 4 {
		m := []*member{owner, client}[i%2]
		wg.Go(func() {
			for j := 0; ctx.Err() == nil; j++ {
				// Gaps between streams, of a few sweeps' ticks at most.
				time.Sleep(time.Duration(j%4) * time.Millisecond)
				err := do(m)
				if err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err)
					continue
				}
				ok.Add(1)
			}
		})
	}
	wg.Go(func() {
		for ctx.Err() == nil {
			owner.tr.CloseIdleConnections()
			client.tr.CloseIdleConnections()
			time.Sleep(2 * time.Millisecond)
		}
	})
	wg.Wait()
	if n := failed.Load(); n > 0 {
		t.Errorf("%d of %d requests failed while connections retired; first: %v", n, n+ok.Load(), firstErr.Load())
	}
	if ok.Load() == 0 {
		t.Fatal("no request succeeded")
	}
	t.Logf("%d requests", ok.Load())

	// Then nothing of the retirements is left: no connection in the pool,
	// no socket to the upstream held open here, no
	// retirement's goroutine and no ClientConn's read loop.
	_, port, _ := net.SplitHostPort(addr)
	// A descriptor left open is closed by the garbage collector in the
	// end: a retirement has 1s, four times closeWait, to close its own.
	start := time.Now()
	deadline := start.Add(5 * time.Second)
	for {
		owner.tr.CloseIdleConnections()
		c, _ := owner.pool.Candidates(key, nil)
		socks := adv11Sockets(t, port)
		dead := adv11DeadSockets(t)
		buf := make([]byte, 1<<20)
		stacks := string(buf[:runtime.Stack(buf, true)])
		retiring := strings.Count(stacks, "retireH2InOrder")
		readLoops := strings.Count(stacks, "http2.(*clientConnReadLoop).run")
		if len(c) == 0 && socks == 0 && dead == 0 && retiring == 0 && readLoops == 0 {
			break
		}
		if time.Now().After(deadline) || dead > 0 && time.Since(start) > 4*closeWait {
			t.Fatalf("after the load: %d connections still in the pool %+v, %d sockets to the upstream open, %d descriptors of closed sockets, %d retirements and %d read loops running", len(c), c, socks, dead, retiring, readLoops)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// adv11DeadSockets counts this process's descriptors of sockets the kernel
// lists nowhere (TCP, TCP6, unix): TCP sockets closed at both ends whose
// descriptor was never closed.
func adv11DeadSockets(t *testing.T) int {
	t.Helper()
	known := map[string]bool{}
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6", "/proc/net/unix"} {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			fs := strings.Fields(line)
			switch {
			case strings.HasSuffix(f, "unix") && len(fs) >= 7:
				known[fs[6]] = true
			case len(fs) >= 10:
				known[fs[9]] = true
			}
		}
	}
	es, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("no /proc/self/fd: %v", err)
	}
	n := 0
	for _, e := range es {
		l, err := os.Readlink("/proc/self/fd/" + e.Name())
		if err != nil || !strings.HasPrefix(l, "socket:[") {
			continue
		}
		if !known[strings.TrimSuffix(strings.TrimPrefix(l, "socket:["), "]")] {
			n++
		}
	}
	return n
}

// adv11Sockets counts this host's TCP sockets with port as their remote
// port that a descriptor still holds (inode not 0): the client ends of
// connections to a loopback upstream not closed yet.
func adv11Sockets(t *testing.T, port string) int {
	t.Helper()
	b, err := os.ReadFile("/proc/net/tcp")
	if err != nil {
		t.Skipf("no /proc/net/tcp: %v", err)
	}
	p, _ := strconv.Atoi(port)
	want := fmt.Sprintf(":%04X", p)
	n := 0
	for _, line := range strings.Split(string(b), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) < 10 || !strings.HasSuffix(f[2], want) {
			continue
		}
		if f[9] != "0" { // a descriptor holds it
			n++
		}
	}
	return n
}

type errString string

func (e errString) Error() string { return string(e) }
