package proxy

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/orbitpool"
)

// TestAdv70cLeavingEvictorsChainEveryWake: eight requests to a capped
// upstream find the table full of idle connections of a capped key, an idle
// connection of another key B and a busy one. Each evicts one of the capped
// idle connections (it leaves in good order, keeping its slot up to
// closeWait: the upstream does not close its side) and pauses for room
// (every pause outlasts the test: only wakes make them ask). While their
// evictions still leave, requests to B finish on B's connection one after
// another: each is an event (a connection gone idle). None of the paused
// requests may evict (each one's eviction is leaving), so none can use it.
// An event must still cost about one ask of the pool, not one per paused
// request: each woken waiter that could not look passes the wake on to the
// next, down the whole queue.
func TestAdv70cLeavingEvictorsChainEveryWake(t *testing.T) {
	m, uB, cp, end := adv70cLeavingEvictors(t)
	retired := m.node.Stats().Retired
	events, asks := 0, int64(0)
	for range 30 {
		ev, base := m.node.room.events.Load(), cp.n.Load()
		if _, body, err := roundTripWithin(m.tr, uB+"/", 2*time.Second); err != nil || body != "ok" {
			end()
			t.Fatalf("B: %q, %v", body, err)
		}
		waitFor(t, 2*time.Second, "B's connection to go idle", func() bool { return m.node.room.events.Load() > ev })
		time.Sleep(2 * time.Millisecond)
		settled := m.node.room.n.Load() == adv70cPaused
		if m.node.Stats().Retired != retired || !settled {
			break // an eviction has left: the window is over
		}
		events++
		asks += cp.n.Load() - base
	}
	end()
	if events == 0 {
		t.Fatal("no event while the evictions were leaving")
	}
	if asks > 3*int64(events) {
		t.Fatalf("%d asks of the pool for %d events none of %d paused requests could use (%.1f per event); want about one per event", asks, events, adv70cPaused, float64(asks)/float64(events))
	}
}

// TestAdv70cLeavingEvictorsDenseEvents is
// TestAdv70cLeavingEvictorsChainEveryWake with the events as a busy process
// makes them: four clients send requests to B back to back for 60ms while
// the eight paused requests' evictions leave. Each event must cost about one
// ask of the pool.
func TestAdv70cLeavingEvictorsDenseEvents(t *testing.T) {
	m, uB, cp, end := adv70cLeavingEvictors(t)
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
	end()
	if events == 0 {
		t.Fatal("no event while the evictions were leaving")
	}
	if asks > 3*int64(events) {
		t.Fatalf("%d asks of the pool for %d events none of %d paused requests could use (%.1f per event); want about one per event", asks, events, adv70cPaused, float64(asks)/float64(events))
	}
}

// adv70cPaused is how many requests adv70cLeavingEvictors pauses.
const adv70cPaused = 8

// adv70cLeavingEvictors sets up eight requests to a capped upstream in a
// table full of idle connections of a capped key, an idle connection of
// another key B and a busy one: each evicts one of the capped idle
// connections (it leaves in good order, keeping its slot up to closeWait:
// the upstream does not close its side) and pauses for room (every pause
// outlasts the test: only wakes make them ask). It returns the member, B's
// URL, the count of the paused requests' asks of the pool, and a function
// that cancels them, waits for them, and checks that nothing is left queued.
func adv70cLeavingEvictors(t *testing.T) (m *member, uB string, cp *adv70bCountPolicy, end func()) {
	const k = adv70cPaused
	spec := orbitpool.PoolSpec{Lanes: 1, Keys: 16, ResourcesPerLane: k + 2}
	relC, relH := make(chan struct{}), make(chan struct{})
	t.Cleanup(func() { close(relH) })
	m = newMember(t, spec, nil)
	tc := &Transport{Node: m.node, MaxConnsPerKey: 64}
	held := holdStreams(t, &member{pool: m.pool, node: m.node, tr: tc}, closingStreamUpstream(t, relC, false), k)
	close(relC)
	for _, r := range held {
		drain(r)
	}
	waitFor(t, 3*time.Second, "the capped connections to go idle", func() bool { return adv70Idle(m) == k })
	uB = closingStreamUpstream(t, nil, false)
	if _, body, err := roundTripWithin(m.tr, uB+"/", 2*time.Second); err != nil || body != "ok" {
		t.Fatalf("B: %q, %v", body, err)
	}
	holdStreams(t, m, closingStreamUpstream(t, relH, false), 1)
	cp = &adv70bCountPolicy{}
	wt := &Transport{Node: m.node, MaxConnsPerKey: 8, fullPauseBase: time.Minute, Policy: cp}
	uA := closingStreamUpstream(t, nil, false)
	ctx, cancel := context.WithTimeout(context.Background(), 9*time.Second)
	t.Cleanup(cancel)
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
	return m, uB, cp, func() {
		cancel()
		for range k {
			<-errs
		}
		if w, keys := m.node.room.n.Load(), len(m.node.room.byKey); w != 0 || keys != 0 {
			t.Errorf("%d waiters, %d keys left queued", w, keys)
		}
	}
}
