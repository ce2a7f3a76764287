package proxy

import (
	"context"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	countingupstream "github.com/orbitproxy/orbit/integration/upstream"
)

// startCappedUpstream starts a counting upstream, closed when t ends.
func startCappedUpstream(t *testing.T, o countingupstream.Options) *countingupstream.Server {
	t.Helper()
	up, err := countingupstream.Start(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { up.Close() })
	return up
}

// TestRetiredConnectionLeavesBeforeItsBudget: an upstream that refuses
// connections past its own cap, the fleet's cap set to the same number, and
// every connection retired after one request, so that each request's
// replacement is dialed, by either process, the moment the last one leaves.
// A connection retired in good order keeps its unit of the budget until the
// upstream has closed its side, so no replacement finds the upstream's cap
// full.
func TestRetiredConnectionLeavesBeforeItsBudget(t *testing.T) {
	const limit, perGoroutine = 2, 30
	up := startCappedUpstream(t, countingupstream.Options{MaxConns: limit})
	ms := newFleet(t, 2, func(tr *Transport) {
		tr.MaxConnsPerKey = limit
		tr.MaxRequestsPerConn = 1
	})
	var wg sync.WaitGroup
	errs := make(chan error, 4*perGoroutine)
	for i := range 4 {
		m := ms[i%2]
		wg.Go(func() {
			for range perGoroutine {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				req, _ := http.NewRequestWithContext(ctx, "GET", up.URL+"/", nil)
				resp, err := m.tr.RoundTrip(req)
				if err == nil {
					_, err = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
				cancel()
				if err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("request failed: %v", err)
	}
	st := up.Stats()
	if st.Refused != 0 || st.Peak > limit {
		t.Errorf("the upstream refused %d connections, and saw %d at once, with the fleet's cap at its own %d", st.Refused, st.Peak, limit)
	}
	if st.Accepted < 4*perGoroutine {
		t.Errorf("the upstream accepted %d connections for %d requests, each on a connection of its own", st.Accepted, 4*perGoroutine)
	}
}
