package proxy

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"testing"
	"time"
)

// TestAdv71eDenseStreamEndsDoNotSpinOtherKeys: eight requests to a capped
// HTTP/1.1 upstream pause for room in a table of two slots (a held
// HTTP/1.1 exchange and an h2c connection of another upstream K; every
// pause outlasts the test: only wakes make them ask). Four clients
// send requests to K back to back for 300ms: each stream's end is a
// roomStream event for K alone, which makes no room for the paused
// requests. The eight start during the burst. They must not ask the pool
// again and again: a roomStream event is numbered like any other, so a
// request whose ask it overlaps is not queued (roomWaiters.add) and asks at
// once, though the event was for K alone. Bound: a few asks per request
// over the whole burst, however many streams ended.
func TestAdv71eDenseStreamEndsDoNotSpinOtherKeys(t *testing.T) {
	m, s, release := adv70bFullWithH2(t, 0)
	defer close(release)
	cp := &adv70bCountPolicy{}
	wt := &Transport{Node: m.node, MaxConnsPerKey: 8, fullPauseBase: time.Minute, Policy: cp}
	url := closingStreamUpstream(t, nil, false)
	const n = 8
	ctx, cancel := context.WithTimeout(context.Background(), 9*time.Second)
	defer cancel()
	ev0 := m.node.room.events.Load()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				roundTripWithin(m.tr, s.url+"/", 2*time.Second)
			}
		}()
	}
	time.Sleep(50 * time.Millisecond)
	base := cp.n.Load()
	errs := make(chan error, n)
	for range n {
		go func() {
			req, _ := http.NewRequestWithContext(ctx, "GET", url+"/", nil)
			resp, err := wt.RoundTrip(req)
			if resp != nil {
				drain(resp)
				err = errors.New("served")
			}
			errs <- err
		}()
	}
	time.Sleep(300 * time.Millisecond)
	close(stop)
	wg.Wait()
	time.Sleep(50 * time.Millisecond)
	asks, events := cp.n.Load()-base, m.node.room.events.Load()-ev0
	cancel()
	for range n {
		if err := <-errs; !errors.Is(err, context.Canceled) {
			t.Errorf("a paused request cancelled by its client: %v; want context.Canceled", err)
		}
	}
	t.Logf("%d asks, %d events", asks, events)
	if w := m.node.room.n.Load(); w != 0 {
		t.Errorf("%d waiters left queued", w)
	}
	if asks > 4*n {
		t.Fatalf("%d asks of the pool by %d paused requests during %d stream ends of another key, none making room for them; want a few per request", asks, n, events)
	}
}
