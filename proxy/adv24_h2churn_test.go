package proxy

import (
	"context"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestAdv24H2LimitLoweredToCallersUnderChurn: four callers run requests one
// after another on one connection whose upstream then lowers its stream
// limit from 100 to 4. Never more than 4 streams are wanted at once, so the
// connection suffices, as it does for net/http's client: the pool must not
// take the lowered limit, read with the connection full, for a limit below
// its streams and cap the capacity at the streams running here (3, when a
// stream that just ended still counts in the ClientConn), which sends the
// next request to dial.
func TestAdv24H2LimitLoweredToCallersUnderChurn(t *testing.T) {
	for _, tc := range []struct {
		name  string
		orbit bool
	}{{"net/http", false}, {"orbit", true}} {
		t.Run(tc.name, func(t *testing.T) {
			for round := range 5 {
				testAdv24Churn(t, tc.orbit, round)
			}
		})
	}
}

func testAdv24Churn(t *testing.T, orbit bool, round int) {
	const callers = 4
	up := newRawH2(t, func(s *rawStream) {
		s.headers(false, ":status", "200", "content-type", "text/plain")
		s.data(true, []byte("ok"))
	})
	var rt http.RoundTripper
	var m *member
	if orbit {
		m = newMemberOpts(t, testSpecLocal, NodeOptions{SweepInterval: time.Hour}, func(tr *Transport) { tr.H2C = true; tr.MaxConnsPerKey = 4 })
		rt = m.tr
	} else {
		var p http.Protocols
		p.SetUnencryptedHTTP2(true)
		tr := &http.Transport{Protocols: &p}
		t.Cleanup(tr.CloseIdleConnections)
		rt = tr
	}
	get := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", up.url+"/", nil)
		o := roundTripOutcome(rt, req)
		if o.err != "" || o.body != "ok" {
			return &outcomeErr{o}
		}
		return nil
	}
	if err := get(); err != nil {
		t.Fatalf("round %d: first request: %v", round, err)
	}
	waitFor(t, 5*time.Second, "the first SETTINGS acknowledged", func() bool { return up.acks.Load() == 1 })
	var fails atomic.Int64
	var wg sync.WaitGroup
	deadline := time.Now().Add(600 * time.Millisecond)
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) {
				if err := get(); err != nil {
					fails.Add(1)
				}
			}
		}()
	}
	time.Sleep(150 * time.Millisecond)
	up.setLimit(callers)
	wg.Wait()
	up.mu.Lock()
	conns := len(up.conns)
	up.mu.Unlock()
	var created uint64
	if m != nil {
		created = m.node.stats.created.Load()
	}
	if fails.Load() > 0 {
		t.Errorf("round %d: %d requests failed", round, fails.Load())
	}
	if conns != 1 {
		t.Errorf("round %d: %d connections dialed (%d created) for %d callers, the upstream's limit lowered to %d; want 1",
			round, conns, created, callers, callers)
	}
}

type outcomeErr struct{ o h2Outcome }

func (e *outcomeErr) Error() string { return e.o.err + " body=" + e.o.body }
