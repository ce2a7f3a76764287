package proxy

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/orbitpool"
)

// TestAdv71gH2EvictTakenStreamStrandsEvictor: the interleaving
// TestAdv71gH2EvictRaceKeepsOtherIdle hunts for, made certain. A table of
// two slots holds X, an h2c connection of key K whose stream has ended (no
// stream: evictable), and Y, an idle HTTP/1.1 connection of key L that went
// idle after X. E, a capped HTTP/1.1 request to key J, finds the table full
// and evictIdle's scan reads X with no stream; it is held there (X's mutex,
// which the scan's isDraining takes, is held by the test: the scheduler
// preempting E at that point does the same). Meanwhile R, a long stream to
// K, is handed X by the pool and starts its stream. Then E goes on: it
// stops X's offers, finds a stream on X (so does not retire it), and
// returns X as its eviction all the same. X keeps its slot for R's whole
// stream, E may not evict again while X holds it (Node.leaving), and Y sits
// idle: E fails "table full" at its deadline. For HTTP/1.1 a connection a
// request takes as it is chosen is passed over for the next (claimIdle).
// Asserted: E is served within 2s, and R's stream runs.
func TestAdv71gH2EvictTakenStreamStrandsEvictor(t *testing.T) {
	kURL, lURL, jURL := evictRaceUpstreams(t)
	spec := orbitpool.PoolSpec{Lanes: 1, Keys: 16, ResourcesPerLane: 2}
	m := newMember(t, spec, nil)
	hk, x, err := fillWithIdleH2(m, kURL, lURL)
	if err != nil {
		t.Fatal(err)
	}
	x.mu.Lock()
	locked := true
	unlock := func() {
		if locked {
			locked = false
			x.mu.Unlock()
		}
	}
	defer unlock()
	he := &Transport{Node: m.node, MaxConnsPerKey: 4}
	type result struct {
		body string
		err  error
	}
	eCh := make(chan result, 1)
	go func() {
		_, body, err := roundTripWithin(he, jURL+"/", 2*time.Second)
		eCh <- result{body, err}
	}()
	time.Sleep(100 * time.Millisecond) // E is in evictIdle's scan, at X
	rctx, rcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer rcancel()
	rCh := make(chan *http.Response, 1)
	rErr := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(rctx, "GET", kURL+"/hold", nil)
		resp, err := hk.RoundTrip(req)
		rCh <- resp
		rErr <- err
	}()
	deadline := time.Now().Add(2 * time.Second)
	for x.active.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	started := x.active.Load() == 1
	unlock()
	if !started {
		rcancel()
		<-eCh
		t.Fatalf("R's stream did not start on X while E was held at it")
	}
	resp, err := <-rCh, <-rErr
	if err != nil {
		rcancel()
		<-eCh
		t.Fatalf("R, handed X: %v", err)
	}
	defer resp.Body.Close()
	e := <-eCh
	if e.err != nil || e.body != "ok" {
		t.Fatalf("E (key J), Y idle all along, after R's stream started on X as E chose it: %q %v; X draining %v, streams %d, in its slot %v; stats %+v; want E to pass X over and evict Y",
			e.body, e.err, x.isDraining(), x.active.Load(), m.node.lookupH2(x.id) == x, m.node.Stats())
	}
}
