package proxy

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/orbitpool"
)

// TestAdv70ManyWaitersFewEvents: six requests, to six capped upstreams,
// pause for room in a table of two slots, full of two held streams whose
// connections then close. Only the room the process's own connections make
// can serve them (every pause outlasts the deadline): two leave, and each
// served request's connection then goes idle, to be evicted for the next.
// All six must be served, and no waiter stays queued.
func TestAdv70ManyWaitersFewEvents(t *testing.T) {
	spec := orbitpool.PoolSpec{Lanes: 1, Keys: 16, ResourcesPerLane: 2}
	release := make(chan struct{})
	other := closingStreamUpstream(t, release, true)
	m := newMember(t, spec, func(tr *Transport) {
		tr.MaxConnsPerKey = 8
		tr.fullPauseBase = time.Minute
	})
	held := holdStreams(t, m, other, 2)
	const n = 6
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		url := closingStreamUpstream(t, nil, false)
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, body, err := roundTripWithin(m.tr, url+"/", 8*time.Second)
			if err == nil && body != "ok" {
				err = fmt.Errorf("body %q", body)
			}
			errs[i] = err
		}()
		waitFor(t, 3*time.Second, "the request to pause", func() bool { return m.node.room.n.Load() == int32(i+1) })
	}
	close(release)
	for _, r := range held {
		drain(r)
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("paused requests not served (%d waiters left, %d idle): %v", m.node.room.n.Load(), adv70Idle(m), err)
	}
	if w := m.node.room.n.Load(); w != 0 {
		t.Fatalf("%d waiters left queued", w)
	}
}

// TestAdv70CloseDuringPause: Node.Close while requests pause for room: they
// end promptly with an error (production pauses), and none stays queued;
// cancelled ones too.
func TestAdv70CloseDuringPause(t *testing.T) {
	spec := orbitpool.PoolSpec{Lanes: 1, Keys: 16, ResourcesPerLane: 2}
	release := make(chan struct{})
	defer close(release)
	other := closingStreamUpstream(t, release, false)
	url := closingStreamUpstream(t, nil, false)
	m := newMember(t, spec, func(tr *Transport) { tr.MaxConnsPerKey = 8 })
	holdStreams(t, m, other, 2)
	const n = 8
	errs := make(chan error, n)
	cancels := make([]context.CancelFunc, n)
	for i := range n {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		cancels[i] = cancel
		go func() {
			req, _ := http.NewRequestWithContext(ctx, "GET", url+"/", nil)
			resp, err := m.tr.RoundTrip(req)
			if resp != nil {
				drain(resp)
				err = errors.New("served")
			}
			errs <- err
		}()
	}
	defer func() {
		for _, c := range cancels {
			c()
		}
	}()
	time.Sleep(150 * time.Millisecond)
	for i := range n / 2 {
		cancels[i]()
	}
	start := time.Now()
	go m.node.Close()
	for range n {
		select {
		case err := <-errs:
			if err == nil || err.Error() == "served" {
				t.Fatalf("a paused request after Close: %v", err)
			}
		case <-time.After(3 * time.Second):
			t.Fatal("a paused request did not end after Close")
		}
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("paused requests ended %v after Close; want promptly", d)
	}
	if w := m.node.room.n.Load(); w != 0 {
		t.Fatalf("%d waiters left queued", w)
	}
}
