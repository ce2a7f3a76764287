package proxy

import (
	"context"
	"errors"
	"io"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/orbitpool"
)

// adv70bCountPolicy is LocalFirst, counting the pool's decisions: one per
// Acquire that reaches the policy (every ask of a full table does).
type adv70bCountPolicy struct{ n atomic.Int64 }

func (p *adv70bCountPolicy) Decide(v *orbitpool.View) orbitpool.Decision {
	p.n.Add(1)
	return orbitpool.LocalFirst{}.Decide(v)
}

// h2cHoldServer is an h2c upstream allowing maxStreams streams per
// connection: /hold answers 200 and holds its body open until release is
// closed (or the request ends); anything else answers "ok".
func h2cHoldServer(t *testing.T, release <-chan struct{}, maxStreams int) *h2cServer {
	return newH2CServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/hold" {
			w.WriteHeader(200)
			w.(http.Flusher).Flush()
			select {
			case <-release:
			case <-r.Context().Done():
			}
			return
		}
		io.WriteString(w, "ok")
	}, maxStreams)
}

// adv70bFullWithH2 fills a table of two slots with a held HTTP/1.1 stream
// and an HTTP/2 (h2c) connection with a held stream, and returns the
// member (its transport speaks h2c), the h2c server, and the release.
func adv70bFullWithH2(t *testing.T, maxStreams int) (*member, *h2cServer, chan struct{}) {
	spec := orbitpool.PoolSpec{Lanes: 1, Keys: 16, ResourcesPerLane: 2}
	release := make(chan struct{})
	s := h2cHoldServer(t, release, maxStreams)
	other := closingStreamUpstream(t, release, false)
	m := newMember(t, spec, func(tr *Transport) { tr.H2C = true; tr.HTTP2 = true })
	h1 := &Transport{Node: m.node}
	holdStreams(t, &member{pool: m.pool, node: m.node, tr: h1}, other, 1)
	req, _ := http.NewRequest("GET", s.url+"/hold", nil)
	resp, err := m.tr.RoundTrip(req)
	if err != nil {
		close(release)
		t.Fatalf("h2c held stream: %v", err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return m, s, release
}

// TestAdv70bNoRoomEventsDoNotSpin: forty requests to a capped HTTP/1.1
// upstream pause for room in a table full of busy connections (every pause
// outlasts the test: only wakes make them ask). Another upstream's HTTP/2
// streams then end on this process, ten of them, one after another: each is
// an event, none makes room for the paused requests. An event must cost a
// bounded number of asks of the pool, not one per paused request: else a
// busy HTTP/2 upstream (thousands of stream ends a second) turns every
// paused request into a busy loop on the table's lock.
func TestAdv70bNoRoomEventsDoNotSpin(t *testing.T) {
	m, s, release := adv70bFullWithH2(t, 0)
	defer close(release)
	cp := &adv70bCountPolicy{}
	wt := &Transport{Node: m.node, MaxConnsPerKey: 8, fullPauseBase: time.Minute, Policy: cp}
	url := closingStreamUpstream(t, nil, false)
	const n, events = 40, 10
	ctx, cancel := context.WithTimeout(context.Background(), 9*time.Second)
	defer cancel()
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
	waitFor(t, 5*time.Second, "the requests to pause", func() bool { return m.node.room.n.Load() == n })
	base := cp.n.Load()
	for range events {
		ev := m.node.room.events.Load()
		_, body, err := roundTripWithin(m.tr, s.url+"/", 2*time.Second)
		if err != nil || body != "ok" {
			t.Fatalf("an h2c request: %q, %v", body, err)
		}
		waitFor(t, 2*time.Second, "the stream's end", func() bool { return m.node.room.events.Load() > ev })
		waitFor(t, 2*time.Second, "the paused requests to settle", func() bool { return m.node.room.n.Load() == n })
	}
	time.Sleep(50 * time.Millisecond)
	asks := cp.n.Load() - base
	cancel()
	for range n {
		if err := <-errs; !errors.Is(err, context.Canceled) {
			t.Errorf("a paused request cancelled by its client: %v; want context.Canceled", err)
		}
	}
	if w := m.node.room.n.Load(); w != 0 {
		t.Errorf("%d waiters left queued", w)
	}
	if asks > 3*events {
		t.Fatalf("%d asks of the pool for %d events that made no room, with %d requests paused (%.1f per event); want a bounded number per event", asks, events, n, float64(asks)/events)
	}
}
