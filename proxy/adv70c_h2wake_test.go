package proxy

import (
	"errors"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/orbitpool"
)

// adv70cStreamOnly is LocalFirst, except that while armed it takes only a
// local connection with room and otherwise waits (ActionWait: a policy may
// decline): the request parks in the key's queue of the pool until one of
// its connections has room. It is what a request that is woken and then
// asks just after a stream of its key ended does with LocalFirst.
type adv70cStreamOnly struct {
	armed   atomic.Bool
	once    sync.Once
	entered chan struct{}
}

func (p *adv70cStreamOnly) Decide(v *orbitpool.View) orbitpool.Decision {
	if !p.armed.Load() {
		return orbitpool.LocalFirst{}.Decide(v)
	}
	p.once.Do(func() { close(p.entered) })
	for i, c := range v.Candidates {
		if c.Local && c.Room() > 0 {
			p.armed.Store(false)
			return orbitpool.Decision{Action: orbitpool.ActionReuse, Candidate: i}
		}
	}
	return orbitpool.Decision{Action: orbitpool.ActionWait, Reason: orbitpool.ReasonPolicy}
}

// TestAdv70cGlobalWakeSpentOnAStream: a table of two slots holds an h2c
// connection (one stream at a time, held) and an HTTP/1.1 connection with a
// held exchange that closes it. WK, a request to the h2c upstream, pauses
// for room first; WA, a capped HTTP/1.1 request, pauses behind it (every
// pause outlasts the deadlines: only a wake serves them). The HTTP/1.1
// connection then leaves the table: a slot is free, and the event wakes the
// oldest, WK. Before WK finds the slot, the held h2c stream ends (its
// policy declines once, so WK waits on the pool for its key, which is what
// WK sees when that end comes between its wake and its ask): the stream's
// end wakes WK's key's oldest, and none is queued, WK having been taken out
// for the first event. WK takes the stream, and counts the wake as used.
// The free slot then has no waiter woken for it: WA must still be served.
func TestAdv70cGlobalWakeSpentOnAStream(t *testing.T) {
	spec := orbitpool.PoolSpec{Lanes: 1, Keys: 16, ResourcesPerLane: 2}
	relO, h2release := make(chan struct{}), make(chan struct{})
	var o1, o2 sync.Once
	closeO := func() { o1.Do(func() { close(relO) }) }
	endH2 := func() { o2.Do(func() { close(h2release) }) }
	defer closeO()
	defer endH2()
	s := h2cHoldServer(t, h2release, 1)
	m := newMember(t, spec, nil)
	heldO := holdStreams(t, m, closingStreamUpstream(t, relO, true), 1)[0]
	gate := &adv70cStreamOnly{entered: make(chan struct{})}
	hk := &Transport{Node: m.node, H2C: true, HTTP2: true, fullPauseBase: time.Minute, Policy: gate}
	req, _ := http.NewRequest("GET", s.url+"/hold", nil)
	heldH2, err := hk.RoundTrip(req)
	if err != nil {
		t.Fatalf("the held h2c stream: %v", err)
	}
	defer heldH2.Body.Close()
	wk := make(chan error, 1)
	go func() {
		_, body, err := roundTripWithin(hk, s.url+"/", 8*time.Second)
		if err == nil && body != "ok" {
			err = errors.New("body " + body)
		}
		wk <- err
	}()
	waitFor(t, 3*time.Second, "WK to pause", func() bool { return m.node.room.n.Load() == 1 })
	wa := &Transport{Node: m.node, MaxConnsPerKey: 8, fullPauseBase: time.Minute}
	live := closingStreamUpstream(t, nil, false)
	waErr := make(chan error, 1)
	go func() {
		_, body, err := roundTripWithin(wa, live+"/", 4*time.Second)
		if err == nil && body != "ok" {
			err = errors.New("body " + body)
		}
		waErr <- err
	}()
	waitFor(t, 3*time.Second, "WA to pause", func() bool { return m.node.room.n.Load() == 2 })
	gate.armed.Store(true)
	closeO()
	drain(heldO)
	select {
	case <-gate.entered:
	case <-time.After(3 * time.Second):
		t.Fatalf("WK not woken by the HTTP/1.1 connection's leaving (%d waiters)", m.node.room.n.Load())
	}
	endH2()
	drain(heldH2)
	if err := <-wk; err != nil {
		t.Fatalf("WK, its stream free: %v", err)
	}
	err = <-waErr
	if w, k := m.node.room.n.Load(), len(m.node.room.byKey); w != 0 || k != 0 {
		t.Errorf("%d waiters, %d keys left queued", w, k)
	}
	if err != nil {
		t.Fatalf("WA, a slot free since the HTTP/1.1 connection left: %v (stats %+v); want it woken and served", err, m.node.Stats())
	}
}
