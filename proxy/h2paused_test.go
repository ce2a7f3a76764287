package proxy

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/orbitpool"
)

// h2AtOneStream is a table of two slots that holds a held HTTP/1.1 stream
// and an h2c connection whose upstream allows one stream at a time, that one
// held: a request to the upstream finds no stream and no room for a
// connection, and pauses for room. Every pause outlasts its request's
// deadline: only a wake serves it.
type h2AtOneStream struct {
	m    *member
	up   *rawH2
	key  orbitpool.Key
	held *http.Response
	// goAway has the upstream send GOAWAY on the held stream, which then
	// stays open until endH2.
	goAway, endH2, endH1 func()
}

func newH2AtOneStream(t *testing.T) *h2AtOneStream {
	release, goaway, h2release := make(chan struct{}), make(chan struct{}), make(chan struct{})
	var o1, o2, o3 sync.Once
	f := &h2AtOneStream{
		endH1:  func() { o1.Do(func() { close(release) }) },
		goAway: func() { o2.Do(func() { close(goaway) }) },
		endH2:  func() { o3.Do(func() { close(h2release) }) },
	}
	t.Cleanup(f.endH1)
	f.up = newRawH2(t, func(s *rawStream) {
		if s.path == "/hold" {
			s.headers(false, ":status", "200")
			select {
			case <-goaway:
				s.goAway(s.id)
				select {
				case <-h2release:
				case <-time.After(20 * time.Second):
				}
			case <-h2release:
			case <-time.After(20 * time.Second):
			}
			s.data(true, nil)
			return
		}
		s.headers(false, ":status", "200", "content-length", "2")
		s.data(true, []byte("ok"))
	})
	t.Cleanup(f.endH2) // before the upstream closes (cleanups run last first)
	f.m = newMember(t, orbitpool.PoolSpec{Lanes: 1, Keys: 16, ResourcesPerLane: 2}, func(tr *Transport) {
		tr.H2C = true
		tr.HTTP2 = true
		tr.fullPauseBase = time.Minute
	})
	h1 := &Transport{Node: f.m.node}
	holdStreams(t, &member{pool: f.m.pool, node: f.m.node, tr: h1}, closingStreamUpstream(t, release, false), 1)
	req, _ := http.NewRequest("GET", f.up.url+"/hold", nil)
	held, err := f.m.tr.RoundTrip(req)
	if err != nil {
		t.Fatalf("the held h2c stream: %v", err)
	}
	t.Cleanup(func() { held.Body.Close() })
	f.held = held
	f.key = mustKey(t, f.m.tr, f.up.url)
	f.setLimit(t, 1)
	return f
}

// setLimit has the upstream allow n streams, and waits for the table to
// say so.
func (f *h2AtOneStream) setLimit(t *testing.T, n int) {
	f.up.setLimit(uint32(n))
	waitFor(t, 5*time.Second, "the h2c connection's capacity to follow the upstream's limit", func() bool {
		c, _ := f.m.pool.Candidates(f.key, nil)
		return len(c) == 1 && c[0].Capacity == n
	})
}

// TestH2LimitRaisedWakesEveryPaused: three requests to the h2c upstream
// pause, each a long-lived stream (held open once it has its head). The
// upstream raises its SETTINGS_MAX_CONCURRENT_STREAMS from 1 to 100: room
// for 99 more streams on the connection, which signals one roomStream
// event and wakes the key's oldest; it takes a stream and keeps it, so
// nothing passes the wake on and no stream ends. The other two must be
// served as well, not left asleep beside 98 free streams, and none may
// stay queued.
func TestH2LimitRaisedWakesEveryPaused(t *testing.T) {
	f := newH2AtOneStream(t)
	const n = 3
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
	defer cancel()
	got := make(chan error, n)
	for range n {
		go func() {
			req, _ := http.NewRequestWithContext(ctx, "GET", f.up.url+"/hold", nil)
			resp, err := f.m.tr.RoundTrip(req)
			if err == nil {
				t.Cleanup(func() { resp.Body.Close() })
			}
			got <- err
		}()
	}
	waitFor(t, 3*time.Second, "the requests to pause for room", func() bool { return f.m.node.room.n.Load() == n })
	f.setLimit(t, 100)
	served, failed := 0, error(nil)
	for range n {
		if err := <-got; err == nil {
			served++
		} else {
			failed = err
		}
	}
	left := f.m.node.room.n.Load()
	f.endH2()
	f.endH1()
	if served != n || left != 0 {
		t.Fatalf("%d of %d paused requests served once their key's connection had room for 99 more streams, %d still queued; one failed: %v", served, n, left, failed)
	}
}

// TestH2GoAwayWhilePaused: two requests to the h2c upstream pause. The
// upstream then sends GOAWAY (the held stream may finish) and ends the held
// stream: the connection drains and leaves the table. Both paused requests
// must be woken and served, on a new connection, and nothing may stay
// queued.
func TestH2GoAwayWhilePaused(t *testing.T) {
	f := newH2AtOneStream(t)
	const k = 2
	done := make(chan error, k)
	for i := range k {
		go func() {
			_, body, err := roundTripWithin(f.m.tr, f.up.url+"/", 6*time.Second)
			if err == nil && body != "ok" {
				err = errors.New("body " + body)
			}
			done <- err
		}()
		waitFor(t, 3*time.Second, "the request to pause for room", func() bool { return f.m.node.room.n.Load() == int32(i+1) })
	}
	f.goAway()
	time.Sleep(50 * time.Millisecond) // the GOAWAY read before the stream ends
	f.endH2()
	drain(f.held)
	var errs []error
	for range k {
		if err := <-done; err != nil {
			errs = append(errs, err)
		}
	}
	f.endH1()
	if len(errs) > 0 {
		t.Fatalf("paused requests after their key's connection went away and left: %v (stats %+v); want each woken and served on a new connection", errs, f.m.node.Stats())
	}
	if w, keys := f.m.node.room.n.Load(), len(f.m.node.room.byKey); w != 0 || keys != 0 {
		t.Fatalf("%d waiters, %d keys left queued", w, keys)
	}
}
