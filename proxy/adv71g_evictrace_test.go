package proxy

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/orbitpool"
)

// TestAdv71gH2EvictRaceKeepsOtherIdle: a table of two slots holds X, an
// h2c connection of key K whose stream has ended (no stream: evictable),
// and Y, an idle HTTP/1.1 connection of key L that went idle after X. Two
// requests then start together: R, a long stream to K (X's key), and E, a
// capped HTTP/1.1 request to key J, which finds the table full and evicts
// the connection idle longest, X. When R is handed X as E chooses it
// (between evictIdle's scan and its second look at X's streams), E has
// stopped X's offers and counts X as its eviction (Node.leaving) though X
// keeps its slot for R's whole stream: E may not evict Y, idle all along,
// and fails "table full" at its deadline. An HTTP/1.1 connection taken as
// it is chosen is passed over for the next (claimIdle); so must an HTTP/2
// one. Asserted, over many trials: E is served within its 1.5s deadline,
// and R gets its response or a retry-safe error.
func TestAdv71gH2EvictRaceKeepsOtherIdle(t *testing.T) {
	kURL, lURL, jURL := evictRaceUpstreams(t)
	spec := orbitpool.PoolSpec{Lanes: 1, Keys: 16, ResourcesPerLane: 2}
	const trials = 80
	raced := 0
	for i := range trials {
		failed, hit := adv71gEvictTrial(t, spec, kURL, lURL, jURL, i)
		if hit {
			raced++
		}
		if failed != "" {
			t.Fatalf("trial %d: %s", i, failed)
		}
	}
	t.Logf("%d of %d trials had R start on X as E evicted it", raced, trials)
}

func adv71gEvictTrial(t *testing.T, spec orbitpool.PoolSpec, kURL, lURL, jURL string, i int) (failed string, hit bool) {
	m := newMember(t, spec, nil)
	defer m.pool.Close()
	defer m.node.Close()
	hk, x, err := fillWithIdleH2(m, kURL, lURL)
	if err != nil {
		return err.Error(), false
	}
	he := &Transport{Node: m.node, MaxConnsPerKey: 4}
	rctx, rcancel := context.WithTimeout(context.Background(), 4*time.Second)
	defer rcancel()
	start := make(chan struct{})
	var wg sync.WaitGroup
	var rResp *http.Response
	var rErr, eErr error
	var eBody string
	wg.Add(2)
	// A random head start to one side or the other sweeps the window.
	spinR, spinE := 0, rand.IntN(3000)
	if i%2 == 1 {
		spinR, spinE = rand.IntN(3000), 0
	}
	go func() {
		defer wg.Done()
		<-start
		for range spinR {
			time.Now()
		}
		req, _ := http.NewRequestWithContext(rctx, "GET", kURL+"/hold", nil)
		rResp, rErr = hk.RoundTrip(req)
	}()
	go func() {
		defer wg.Done()
		<-start
		for range spinE {
			time.Now()
		}
		_, eBody, eErr = roundTripWithin(he, jURL+"/", 1500*time.Millisecond)
	}()
	close(start)
	wg.Wait()
	// R got its stream on X, and X was evicted under it.
	hit = rErr == nil && x.isDraining() && x.active.Load() > 0
	if testing.Verbose() && i%8 == 0 {
		t.Logf("trial %d: X draining %v active %d in slot %v; R err %v; stats %+v", i, x.isDraining(), x.active.Load(), m.node.lookupH2(x.id) == x, rErr, m.node.Stats())
	}
	if rResp != nil {
		rResp.Body.Close()
	}
	rcancel()
	if rErr != nil && !IsRetrySafe(rErr) {
		return fmt.Sprintf("R, a stream on X's key: not retry-safe: %v", rErr), hit
	}
	if eErr != nil || eBody != "ok" {
		return fmt.Sprintf("E (key J), with Y idle all along: %q %v; X draining %v, R's stream %v (err %v); stats %+v",
			eBody, eErr, x.isDraining(), rResp != nil, rErr, m.node.Stats()), hit
	}
	return "", hit
}

// evictRaceUpstreams starts the upstreams of the eviction race tests: K,
// h2c, where a stream to /hold stays open (6s at most) and any other path
// is answered "ok"; L and J, HTTP/1.1.
func evictRaceUpstreams(t *testing.T) (kURL, lURL, jURL string) {
	h2 := newH2CServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/hold" {
			w.WriteHeader(200)
			w.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
			case <-time.After(6 * time.Second):
			}
			return
		}
		io.WriteString(w, "ok")
	}, 8)
	return h2.url, closingStreamUpstream(t, nil, false), closingStreamUpstream(t, nil, false)
}

// fillWithIdleH2 fills m's table of two slots with X, an h2c connection to
// kURL whose stream has ended (no stream: evictable), and Y, an idle
// HTTP/1.1 connection to lURL that went idle after X. It returns the
// transport of X's key, and X.
func fillWithIdleH2(m *member, kURL, lURL string) (*Transport, *h2conn, error) {
	hk := &Transport{Node: m.node, H2C: true, HTTP2: true}
	if _, body, err := roundTripWithin(hk, kURL+"/", 2*time.Second); err != nil || body != "ok" {
		return nil, nil, fmt.Errorf("X's first stream: %q %v", body, err)
	}
	time.Sleep(2 * time.Millisecond)
	hl := &Transport{Node: m.node, MaxConnsPerKey: 4}
	if _, body, err := roundTripWithin(hl, lURL+"/", 2*time.Second); err != nil || body != "ok" {
		return nil, nil, fmt.Errorf("Y's request: %q %v", body, err)
	}
	var x *h2conn
	for s := range m.node.h2slots {
		if c := m.node.h2slots[s].Load(); c != nil {
			x = c
		}
	}
	if st := m.node.Stats(); st.OpenConns != 2 || x == nil || !x.ended.Load() || x.active.Load() != 0 {
		return nil, nil, fmt.Errorf("want a full table with X, an h2c connection with no stream: %+v", st)
	}
	return hk, x, nil
}
