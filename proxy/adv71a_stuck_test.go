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

// adv71aHoldAfterEvict is LocalFirst, except that the first ask after its
// process has evicted a connection waits for gate (at most 5s): the request
// that evicted is held between its eviction and its pause, as a busy
// machine may hold it.
type adv71aHoldAfterEvict struct {
	node    *Node
	once    sync.Once
	gate    chan struct{}
	entered chan struct{}
	held    atomic.Bool
}

func (p *adv71aHoldAfterEvict) Decide(v *orbitpool.View) orbitpool.Decision {
	if p.node.stats.evicted.Load() >= 1 && p.held.CompareAndSwap(false, true) {
		close(p.entered)
		select {
		case <-p.gate:
		case <-time.After(5 * time.Second):
		}
	}
	return orbitpool.LocalFirst{}.Decide(v)
}

// TestAdv71aEvictorWokenOnceItsEvictionLeft: a table of two slots holds an
// idle connection X of a capped key and a held exchange. S, a request to
// another capped upstream, finds the table full, evicts X (it leaves in good
// order: its upstream keeps its side open, so X keeps its slot for
// closeWait) and, before it pauses, F, a third capped upstream's request,
// finds the table full and nothing to evict, and pauses first. S pauses
// behind F, as one that may not evict (its eviction still leaves). Every
// pause outlasts the deadlines. X then leaves: a free slot, and the event
// wakes F, whose context ends as it asks. The wake F leaves with must reach
// S, which can use a free slot (it needs no eviction): S must be served.
func TestAdv71aEvictorWokenOnceItsEvictionLeft(t *testing.T) {
	spec := orbitpool.PoolSpec{Lanes: 1, Keys: 16, ResourcesPerLane: 2}
	relH := make(chan struct{})
	var oh sync.Once
	endH := func() { oh.Do(func() { close(relH) }) }
	defer endH()
	m := newMember(t, spec, nil)
	tx := &Transport{Node: m.node, MaxConnsPerKey: 8}
	if _, body, err := roundTripWithin(tx, closingStreamUpstream(t, nil, false)+"/", 3*time.Second); err != nil || body != "ok" {
		t.Fatalf("X: %q, %v", body, err)
	}
	holdStreams(t, m, closingStreamUpstream(t, relH, false), 1)
	waitFor(t, 3*time.Second, "X to be idle", func() bool { return adv70Idle(m) == 1 })

	gate := &adv71aHoldAfterEvict{node: m.node, gate: make(chan struct{}), entered: make(chan struct{})}
	var og sync.Once
	openGate := func() { og.Do(func() { close(gate.gate) }) }
	defer openGate()
	ts := &Transport{Node: m.node, MaxConnsPerKey: 8, fullPauseBase: time.Minute, Policy: gate}
	sErr := make(chan error, 1)
	go func() {
		_, body, err := roundTripWithin(ts, closingStreamUpstream(t, nil, false)+"/", 4*time.Second)
		if err == nil && body != "ok" {
			err = errors.New("body " + body)
		}
		sErr <- err
	}()
	select {
	case <-gate.entered:
	case <-time.After(3 * time.Second):
		t.Fatal("S did not evict X")
	}

	ctxF, cancelF := context.WithTimeout(context.Background(), 8*time.Second)
	defer cancelF()
	pf := &adv71aCancelOnAsk{cancel: cancelF, entered: make(chan struct{})}
	tf := &Transport{Node: m.node, MaxConnsPerKey: 8, fullPauseBase: time.Minute, Policy: pf}
	fErr := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctxF, "GET", closingStreamUpstream(t, nil, false)+"/", nil)
		resp, err := tf.RoundTrip(req)
		if resp != nil {
			drain(resp)
		}
		fErr <- err
	}()
	waitFor(t, 3*time.Second, "F to pause", func() bool { return m.node.room.n.Load() == 1 })
	pf.armed.Store(true)
	openGate()
	waitFor(t, 3*time.Second, "S to pause", func() bool { return m.node.room.n.Load() == 2 })
	m.node.room.mu.Lock()
	front, back := m.node.room.all.Front().Value.(*roomWaiter), m.node.room.all.Back().Value.(*roomWaiter)
	m.node.room.mu.Unlock()
	if front.stuck || !back.stuck {
		t.Fatalf("queue: front stuck=%v, back stuck=%v; want F (free) then S (stuck)", front.stuck, back.stuck)
	}
	select {
	case <-pf.entered:
	case <-time.After(3 * time.Second):
		t.Fatal("F was not woken by X's leaving")
	}
	if err := <-fErr; err == nil {
		t.Fatal("F: served; want its ended context")
	}
	err := <-sErr
	endH()
	if err != nil {
		t.Fatalf("S, a slot free since X left and F left with its wake: %v (stats %+v); want it woken and served", err, m.node.Stats())
	}
	if w := m.node.room.n.Load(); w != 0 {
		t.Fatalf("%d waiters left queued", w)
	}
}
