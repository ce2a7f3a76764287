package proxy

import (
	"context"
	"net/http"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestGoAwayRefusalsRideThroughARestart: for its first 600ms, an upstream
// answers every stream with a GOAWAY that leaves it out and closes the
// connection, as one restarting faster than a busy machine sends a stream
// does. net/http's client sends such a request again, on a new connection,
// for as long as its context lasts, and is served. A request through orbit
// has a bounded number of retries; sent at once, each on a new connection,
// they were all refused within a few milliseconds. Spread out (goneBackoff),
// they must outlast the restart.
func TestGoAwayRefusalsRideThroughARestart(t *testing.T) {
	const window = 600 * time.Millisecond
	var (
		mu      sync.Mutex
		first   time.Time
		refused atomic.Int64
	)
	up := newRawH2(t, func(s *rawStream) {
		mu.Lock()
		if first.IsZero() {
			first = time.Now()
		}
		refuse := time.Since(first) < window
		mu.Unlock()
		if refuse {
			refused.Add(1)
			s.goAway(max(s.id, 2) - 2) // every stream before this one
			s.c.nc.Close()
			return
		}
		s.headers(false, ":status", "200")
		s.data(true, []byte("ok"))
	})
	spec := testSpec
	spec.Path = filepath.Join(t.TempDir(), "seg")
	m := newMember(t, spec, func(tr *Transport) {
		tr.H2C = true
		tr.MaxRetries = 3
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	if err := getOK(m, ctx, up.url+"/r"); err != nil {
		t.Fatalf("after %v and %d refusals: %v", time.Since(start).Round(time.Millisecond), refused.Load(), err)
	}
	// The paid retries wait 0, 250 and 500ms: the last comes after the
	// refusals end.
	if n := refused.Load(); n < 2 || n > minFreeRetries+3 {
		t.Fatalf("the upstream refused the request %d times; want at least 2, and no more than its retries", n)
	}

	// Stock, against the same upstream once more.
	mu.Lock()
	first = time.Time{}
	mu.Unlock()
	refused.Store(0)
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	stock := &http.Transport{Protocols: &p}
	defer stock.CloseIdleConnections()
	if err := adv21Get(stock, ctx, up.url+"/r"); err != nil {
		t.Fatalf("net/http's client failed too, so the test shows nothing: %v", err)
	}
}
