package proxy

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/orbitpool"
)

// TestAdv71aKeyWakePassedOnKeepsForKey: a wake from an HTTP/2 stream's end
// (signalKey) is for its key alone. When the waiter it woke leaves without
// it (its context ended as the wake came), the wake passed on to the key's
// next waiter is still for the key alone: that waiter, taking the stream,
// has used it (see Transport.once) and must not pass it on again.
func TestAdv71aKeyWakePassedOnKeepsForKey(t *testing.T) {
	var r roomWaiters
	k := orbitpool.Key{Lo: 7}
	w1, w2 := roomWait{key: k}, roomWait{key: k}
	r.asking(&w1)
	r.asking(&w2)
	r.add(&w1)
	c2 := r.add(&w2)
	rw2 := w2.w
	r.signalKey(k, 1, false)
	r.remove(&w1) // its context ended as the wake came
	select {
	case <-c2:
	default:
		t.Fatal("the key's next waiter was not handed the wake")
	}
	if rw2.by.event != roomStream {
		t.Fatalf("a wake for the key alone, passed on to the key's next waiter, arrived as a wake for %v: the waiter that takes a stream with it will pass it on once more", rw2.by.event)
	}
}

// adv71aCancelOnAsk is LocalFirst until armed; then, at its next ask, it
// ends the request's context and declines (the request leaves with the
// wake it was just given, as one whose deadline comes with the wake).
type adv71aCancelOnAsk struct {
	armed   atomic.Bool
	cancel  context.CancelFunc
	once    sync.Once
	entered chan struct{}
}

func (p *adv71aCancelOnAsk) Decide(v *orbitpool.View) orbitpool.Decision {
	if !p.armed.Load() {
		return orbitpool.LocalFirst{}.Decide(v)
	}
	p.once.Do(func() {
		p.cancel()
		close(p.entered)
	})
	return orbitpool.Decision{Action: orbitpool.ActionWait, Reason: orbitpool.ReasonPolicy}
}

// TestAdv71aStreamEndWakesOneWhenFirstLeaves: a table of two slots holds a
// held HTTP/1.1 stream and an h2c connection allowing one stream, that one
// held. W1, W2 and W3, requests to the h2c upstream, pause for room in that
// order (every pause outlasts their deadlines). The held stream ends: one
// stream's room, for the key. W1 is woken, and its context ends as it asks:
// the wake goes to W2, which takes the stream (held open). That one stream
// must cost W3 nothing: W3 must not be woken to ask the pool while W2's
// stream still holds the connection's one stream.
func TestAdv71aStreamEndWakesOneWhenFirstLeaves(t *testing.T) {
	spec := orbitpool.PoolSpec{Lanes: 1, Keys: 16, ResourcesPerLane: 2}
	relH1, relA, relB := make(chan struct{}), make(chan struct{}), make(chan struct{})
	var o1, o2, o3 sync.Once
	endH1 := func() { o1.Do(func() { close(relH1) }) }
	endA := func() { o2.Do(func() { close(relA) }) }
	endB := func() { o3.Do(func() { close(relB) }) }
	defer endH1()
	defer endA()
	defer endB()
	s := newH2CServer(t, func(w http.ResponseWriter, r *http.Request) {
		var rel chan struct{}
		switch r.URL.Path {
		case "/a":
			rel = relA
		case "/b":
			rel = relB
		default:
			w.Write([]byte("ok"))
			return
		}
		w.WriteHeader(200)
		w.(http.Flusher).Flush()
		select {
		case <-rel:
		case <-r.Context().Done():
		}
	}, 1)
	m := newMember(t, spec, func(tr *Transport) {
		tr.H2C = true
		tr.HTTP2 = true
		tr.fullPauseBase = time.Minute
	})
	h1 := &Transport{Node: m.node}
	holdStreams(t, &member{pool: m.pool, node: m.node, tr: h1}, closingStreamUpstream(t, relH1, false), 1)
	req, _ := http.NewRequest("GET", s.url+"/a", nil)
	heldA, err := m.tr.RoundTrip(req)
	if err != nil {
		t.Fatalf("the held h2c stream: %v", err)
	}
	defer heldA.Body.Close()

	ctx1, cancel1 := context.WithTimeout(context.Background(), 8*time.Second)
	defer cancel1()
	p1 := &adv71aCancelOnAsk{cancel: cancel1, entered: make(chan struct{})}
	t1 := &Transport{Node: m.node, H2C: true, HTTP2: true, fullPauseBase: time.Minute, Policy: p1}
	w1 := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx1, "GET", s.url+"/", nil)
		resp, err := t1.RoundTrip(req)
		if resp != nil {
			drain(resp)
		}
		w1 <- err
	}()
	waitFor(t, 3*time.Second, "W1 to pause", func() bool { return m.node.room.n.Load() == 1 })

	w2 := make(chan *http.Response, 1)
	w2err := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", s.url+"/b", nil)
		resp, err := m.tr.RoundTrip(req)
		if err != nil {
			w2err <- err
			return
		}
		w2 <- resp
		<-relB
		drain(resp)
	}()
	waitFor(t, 3*time.Second, "W2 to pause", func() bool { return m.node.room.n.Load() == 2 })

	cp := &adv70bCountPolicy{}
	t3 := &Transport{Node: m.node, H2C: true, HTTP2: true, fullPauseBase: time.Minute, Policy: cp}
	w3 := make(chan error, 1)
	go func() {
		_, body, err := roundTripWithin(t3, s.url+"/", 8*time.Second)
		if err == nil && body != "ok" {
			err = errors.New("body " + body)
		}
		w3 <- err
	}()
	waitFor(t, 3*time.Second, "W3 to pause", func() bool { return m.node.room.n.Load() == 3 })
	if mustKey(t, t1, s.url) != mustKey(t, t3, s.url) || mustKey(t, m.tr, s.url) != mustKey(t, t3, s.url) {
		t.Fatal("the three transports do not share the key")
	}
	asks := cp.n.Load()

	p1.armed.Store(true)
	endA()
	drain(heldA)
	select {
	case <-p1.entered:
	case <-time.After(3 * time.Second):
		t.Fatal("W1 was not woken by the stream's end")
	}
	if err := <-w1; err == nil {
		t.Fatal("W1: served; want its ended context")
	}
	select {
	case <-w2:
	case err := <-w2err:
		t.Fatalf("W2: %v; want it woken and served on the stream", err)
	case <-time.After(3 * time.Second):
		t.Fatal("W2 not served after W1 left with the stream's wake")
	}
	// W2's RoundTrip has returned: whatever it passed on, it has. Give W3
	// the time to ask if it was woken.
	deadline := time.Now().Add(300 * time.Millisecond)
	for time.Now().Before(deadline) && cp.n.Load() == asks {
		time.Sleep(5 * time.Millisecond)
	}
	extra := cp.n.Load() - asks
	endB() // W2's stream ends: W3's wake, and its stream
	if err := <-w3; err != nil {
		t.Fatalf("W3 once W2's stream ended: %v", err)
	}
	endH1()
	if extra != 0 {
		t.Fatalf("W3 asked the pool %d more times while the one stream was W2's: one stream's end woke two waiters after the first left with it", extra)
	}
}
