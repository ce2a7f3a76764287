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

// TestFailedExchangeLeavesBeforeItsBudget: an upstream that refuses
// connections past its own cap, the fleet's cap set to the same number, and
// clients that give up on a streamed response after its first chunk, while
// others wait for a connection. The connection of a failed exchange keeps
// its unit of the budget until the upstream has closed its side, as one
// retired in good order does: a replacement dialed before then would find
// the upstream's cap full and be refused.
func TestFailedExchangeLeavesBeforeItsBudget(t *testing.T) {
	const limit, rounds = 2, 15
	up := startCappedUpstream(t, countingupstream.Options{MaxConns: limit})
	ms := newFleet(t, 2, func(tr *Transport) { tr.MaxConnsPerKey = limit })
	var wg sync.WaitGroup
	errs := make(chan error, 4*rounds)
	for i := range 4 {
		m := ms[i%2]
		abandon := i < 2
		wg.Go(func() {
			for range rounds {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				path := "/"
				if abandon {
					path = "/stream?n=20&gap=2ms"
				}
				req, _ := http.NewRequestWithContext(ctx, "GET", up.URL+path, nil)
				resp, err := m.tr.RoundTrip(req)
				if err == nil {
					if abandon {
						// Read the first chunk, then go.
						_, err = bufio.NewReader(resp.Body).ReadString('\n')
						cancel()
					} else {
						_, err = io.Copy(io.Discard, resp.Body)
					}
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
	if st := up.Stats(); st.Refused != 0 || st.Peak > limit {
		t.Errorf("the upstream refused %d connections, and saw %d at once, with the fleet's cap at its own %d", st.Refused, st.Peak, limit)
	}
}
