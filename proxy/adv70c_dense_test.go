package proxy

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/orbitpool"
)

// TestAdv70cLeavingEvictorsDenseEvents is
// TestAdv70cLeavingEvictorsChainEveryWake with the events as a busy process
// makes them: four clients send requests to B back to back for 60ms while
// the eight paused requests' evictions leave. Each event must cost about one
// ask of the pool.
func TestAdv70cLeavingEvictorsDenseEvents(t *testing.T) {
	const k = 8
	spec := orbitpool.PoolSpec{Lanes: 1, Keys: 16, ResourcesPerLane: k + 2}
	relC, relH := make(chan struct{}), make(chan struct{})
	defer close(relH)
	m := newMember(t, spec, nil)
	tc := &Transport{Node: m.node, MaxConnsPerKey: 64}
	held := holdStreams(t, &member{pool: m.pool, node: m.node, tr: tc}, closingStreamUpstream(t, relC, false), k)
	close(relC)
	for _, r := range held {
		drain(r)
	}
	waitFor(t, 3*time.Second, "the capped connections to go idle", func() bool { return adv70Idle(m) == k })
	uB := closingStreamUpstream(t, nil, false)
	if _, body, err := roundTripWithin(m.tr, uB+"/", 2*time.Second); err != nil || body != "ok" {
		t.Fatalf("B: %q, %v", body, err)
	}
	holdStreams(t, m, closingStreamUpstream(t, relH, false), 1)
	cp := &adv70bCountPolicy{}
	wt := &Transport{Node: m.node, MaxConnsPerKey: 8, fullPauseBase: time.Minute, Policy: cp}
	uA := closingStreamUpstream(t, nil, false)
	ctx, cancel := context.WithTimeout(context.Background(), 9*time.Second)
	defer cancel()
	errs := make(chan error, k)
	for i := range k {
		go func() {
			req, _ := http.NewRequestWithContext(ctx, "GET", uA+"/", nil)
			resp, err := wt.RoundTrip(req)
			if resp != nil {
				drain(resp)
			}
			errs <- err
		}()
		waitFor(t, 2*time.Second, "the request to evict and pause", func() bool {
			return m.node.room.n.Load() == int32(i+1) && m.node.Stats().Evicted == uint64(i+1)
		})
	}
	ev0, base := m.node.room.events.Load(), cp.n.Load()
	stop := make(chan struct{})
	done := make(chan struct{}, 4)
	for range 4 {
		go func() {
			defer func() { done <- struct{}{} }()
			for {
				select {
				case <-stop:
					return
				default:
				}
				roundTripWithin(m.tr, uB+"/", 2*time.Second)
			}
		}()
	}
	time.Sleep(60 * time.Millisecond)
	events := m.node.room.events.Load() - ev0
	asks := cp.n.Load() - base
	close(stop)
	for range 4 {
		<-done
	}
	cancel()
	for range k {
		<-errs
	}
	if w, keys := m.node.room.n.Load(), len(m.node.room.byKey); w != 0 || keys != 0 {
		t.Errorf("%d waiters, %d keys left queued", w, keys)
	}
	if events == 0 {
		t.Fatal("no event while the evictions were leaving")
	}
	if asks > 3*int64(events) {
		t.Fatalf("%d asks of the pool for %d events none of %d paused requests could use (%.1f per event); want about one per event", asks, events, k, float64(asks)/float64(events))
	}
}
