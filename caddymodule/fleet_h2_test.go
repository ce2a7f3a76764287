package caddymodule

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/h2c"
)

// h2cUpstream is an h2c upstream that counts its connections and its
// concurrent streams, with a stream limit of its own.
type h2cUpstream struct {
	srv       *httptest.Server
	conns     atomic.Int64
	streams   atomic.Int64
	maxStream atomic.Int64
	requests  atomic.Int64
	notH2     atomic.Int64
}

func newH2CUpstream(t *testing.T, maxStreams uint32, delay time.Duration) *h2cUpstream {
	var u *h2cUpstream
	u = newH2CUpstreamHandler(t, maxStreams, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := u.streams.Add(1)
		defer u.streams.Add(-1)
		for {
			m := u.maxStream.Load()
			if n <= m || u.maxStream.CompareAndSwap(m, n) {
				break
			}
		}
		u.requests.Add(1)
		if r.ProtoMajor != 2 {
			u.notH2.Add(1)
		}
		io.Copy(io.Discard, r.Body)
		time.Sleep(delay)
		w.Header().Set("Trailer", "Grpc-Status")
		io.WriteString(w, "ok")
		w.Header().Set("Grpc-Status", "0")
	}))
	return u
}

// newH2CUpstreamHandler is an h2c upstream running h, counting connections.
func newH2CUpstreamHandler(t *testing.T, maxStreams uint32, h http.Handler) *h2cUpstream {
	u := &h2cUpstream{}
	u.srv = httptest.NewUnstartedServer(h2c.NewHandler(h, &http2.Server{MaxConcurrentStreams: maxStreams}))
	u.srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			u.conns.Add(1)
		}
	}
	u.srv.Start()
	t.Cleanup(u.srv.Close)
	return u
}

func (u *h2cUpstream) hostport() string { return u.srv.Listener.Addr().String() }

// TestFleetSharesOneH2CConnection runs four workers in front of an h2c
// upstream that allows 8 concurrent streams. Once one connection is up,
// load from every worker that fits in its stream limit uses that one
// connection (the upstream never sees a second), and heavier load never
// puts more streams on a connection than the upstream allows.
func TestFleetSharesOneH2CConnection(t *testing.T) {
	const maxStreams = 8
	up := newH2CUpstream(t, maxStreams, 20*time.Millisecond)
	f := startFleet(t, 4, "h2c://"+up.hostport())

	// The first connection: one request.
	if bad := failures(runLoad(f.url("/"), 1, 1, nil)); len(bad) > 0 {
		t.Fatalf("first request: %+v", bad[0])
	}
	// Load that fits in the stream limit, from clients spread over the
	// workers: 6 at once.
	rs := runLoad(f.url("/"), 6, 15, nil)
	if bad := failures(rs); len(bad) > 0 {
		t.Fatalf("%d of %d requests failed, first: %+v", len(bad), len(rs), bad[0])
	}
	served := map[string]int{}
	for _, r := range rs {
		served[r.worker]++
	}
	if len(served) < 2 {
		t.Errorf("requests were served by workers %v: the kernel did not spread them", served)
	}
	if c := up.conns.Load(); c != 1 {
		t.Errorf("upstream saw %d connections for load within its stream limit from %d workers, want 1", c, len(served))
	}
	if m := up.maxStream.Load(); m > maxStreams {
		t.Errorf("upstream saw %d concurrent streams, it allows %d", m, maxStreams)
	}
	// Heavier load: 24 at once.
	rs = runLoad(f.url("/"), 24, 6, nil)
	if bad := failures(rs); len(bad) > 0 {
		t.Fatalf("%d of %d requests failed under load over the stream limit, first: %+v", len(bad), len(rs), bad[0])
	}
	if c := up.conns.Load(); c > 4 {
		t.Errorf("upstream saw %d connections; max_conns_per_host is 4", c)
	}
	// Fleet-wide, streams are bounded by the sum of the connections'
	// capacities (a stream over one connection's limit would have been
	// refused by the upstream, and failed above).
	if m, c := up.maxStream.Load(), up.conns.Load(); m > c*maxStreams {
		t.Errorf("upstream saw %d concurrent streams over %d connections of %d streams each", m, c, maxStreams)
	}
	if n := up.notH2.Load(); n != 0 {
		t.Errorf("%d requests reached the upstream over HTTP/1.1", n)
	}
	t.Logf("served by worker: %v; upstream: %d connections, %d concurrent streams at most (limit %d per connection), %d requests",
		served, up.conns.Load(), up.maxStream.Load(), maxStreams, up.requests.Load())
}
