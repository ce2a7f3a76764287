package proxy

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	countingupstream "github.com/orbitproxy/orbit/integration/upstream"
)

// startCappedUpstream starts a counting upstream, closed when t ends.
func startCappedUpstream(t testing.TB, o countingupstream.Options) *countingupstream.Server {
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
	for _, err := range capClients(ms, up.URL, perGoroutine, 0) {
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

// capClients runs four clients of rounds requests each, on the members of ms
// in turn, and returns the errors they met. The first abandoning of them ask
// for a streamed response and leave after its first chunk, which fails
// their exchange; the others get "/" in full.
func capClients(ms []*member, url string, rounds, abandoning int) []error {
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	for i := range 4 {
		m := ms[i%len(ms)]
		abandon := i < abandoning
		wg.Go(func() {
			for range rounds {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				path := "/"
				if abandon {
					path = "/stream?n=20&gap=2ms"
				}
				req, _ := http.NewRequestWithContext(ctx, "GET", url+path, nil)
				resp, err := m.tr.RoundTrip(req)
				if err == nil {
					if abandon {
						_, err = bufio.NewReader(resp.Body).ReadString('\n')
					} else {
						_, err = io.Copy(io.Discard, resp.Body)
					}
					resp.Body.Close()
				}
				cancel()
				if err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	return errs
}
