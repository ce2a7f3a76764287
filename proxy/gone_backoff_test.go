package proxy

import (
	"context"
	"net/http"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/governor"
)

// TestGoAwayRefusalsRideThroughARestart: for its first 200ms, an upstream
// answers every stream with a GOAWAY that leaves it out and closes the
// connection, as one restarting faster than a busy machine sends a stream
// does. net/http's client sends such a request again, on a new connection,
// for as long as its context lasts, and is served. A request through orbit
// has a bounded number of retries; sent at once, each on a new connection,
// they were all refused within a few milliseconds. Spread out (awayBackoff),
// they must outlast the restart.
func TestGoAwayRefusalsRideThroughARestart(t *testing.T) {
	const window = 200 * time.Millisecond
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
	// Its retries wait 0, 25, 50, 100 and 200ms: the sixth attempt comes
	// after the refusals end.
	if n := refused.Load(); n < 2 || n > minFreeRetries+maxAwayRetries+3 {
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

// TestAwayBackoffHoldsNoWorker: a request waiting to send again after an
// upstream went away holds no worker of the governor, as a request waiting
// for the pool holds none: with one worker, it would hold up every other
// request of the process for as long as it waits.
func TestAwayBackoffHoldsNoWorker(t *testing.T) {
	var refused atomic.Int64
	up := newRawH2(t, func(s *rawStream) {
		if refused.Load() < 5 {
			refused.Add(1)
			s.goAway(max(s.id, 2) - 2)
			s.c.nc.Close()
			return
		}
		s.headers(false, ":status", "200")
		s.data(true, []byte("ok"))
	})
	gov := governor.New(1, 0)
	spec := testSpec
	spec.Path = filepath.Join(t.TempDir(), "seg")
	m := newMemberOpts(t, spec, NodeOptions{SweepInterval: 50 * time.Millisecond, Governor: gov}, func(tr *Transport) {
		tr.H2C = true
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- getOK(m, ctx, up.url+"/r") }()
	// After the fifth refusal, the request waits 200ms before its sixth
	// attempt: the worker must be back meanwhile.
	waitFor(t, 5*time.Second, "the fifth refusal", func() bool { return refused.Load() >= 5 })
	idle := false
	for refused.Load() == 5 && !idle {
		idle = gov.Outstanding() == 0
		time.Sleep(time.Millisecond)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if !idle {
		t.Fatal("the request held its worker while it waited to send again")
	}
}
