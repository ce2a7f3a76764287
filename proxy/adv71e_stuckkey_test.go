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

// TestAdv71eIdleWakeSkipsStuckWaiterOfItsKey: a table of two slots holds an
// idle connection X of a capped key and H, a held exchange to upstream US.
// S, a capped request to US, finds the table full, evicts X (which leaves in
// good order, keeping its slot for closeWait) and, held before its next ask,
// lets F, a request to a third upstream, pause first; S then pauses behind
// F as a waiter that may not evict ("stuck"). Every pause outlasts the
// deadlines. H's exchange then ends: H is idle, and it is of S's key: S can
// take it as it is, no eviction needed. The event (roomIdle) wakes F, whose
// context ends as it asks; F passes the wake on, and a roomIdle wake passed
// on skips stuck waiters: S is left asleep, though the room is a connection
// of its own key, until X's leaving (up to 250ms later) frees a slot. S must
// be woken by H's going idle: it must be served before X has left the table.
func TestAdv71eIdleWakeSkipsStuckWaiterOfItsKey(t *testing.T) {
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
	us := closingStreamUpstream(t, relH, false)
	th := &Transport{Node: m.node, MaxConnsPerKey: 8}
	held := holdStreams(t, &member{pool: m.pool, node: m.node, tr: th}, us, 1)[0]
	waitFor(t, 3*time.Second, "X to be idle", func() bool { return adv70Idle(m) == 1 })

	gate := &adv71aHoldAfterEvict{node: m.node, gate: make(chan struct{}), entered: make(chan struct{})}
	var og sync.Once
	openGate := func() { og.Do(func() { close(gate.gate) }) }
	defer openGate()
	ts := &Transport{Node: m.node, MaxConnsPerKey: 8, fullPauseBase: time.Minute, Policy: gate}
	type result struct {
		err     error
		retired uint64
	}
	sRes := make(chan result, 1)
	go func() {
		_, body, err := roundTripWithin(ts, us+"/", 4*time.Second)
		retired := m.node.stats.retired.Load()
		if err == nil && body != "ok" {
			err = errors.New("body " + body)
		}
		sRes <- result{err, retired}
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
	back := m.node.room.all.Back().Value.(*roomWaiter)
	m.node.room.mu.Unlock()
	if !back.stuck {
		t.Fatal("S paused as one that may evict; the setup wants it stuck")
	}
	if r := m.node.stats.retired.Load(); r != 0 {
		t.Fatalf("X left the table (%d retired) before H's end: setup too slow to tell", r)
	}
	endH()
	drain(held)
	select {
	case <-pf.entered:
	case <-time.After(3 * time.Second):
		t.Fatal("F was not woken by H's going idle")
	}
	if err := <-fErr; err == nil {
		t.Fatal("F: served; want its ended context")
	}
	r := <-sRes
	if r.err != nil {
		t.Fatalf("S: %v (stats %+v)", r.err, m.node.Stats())
	}
	if r.retired != 0 {
		t.Fatalf("S was served only once X had left the table (%d retired): the idle connection of S's own key, which F's wake passed on, skipped S as stuck (stats %+v)", r.retired, m.node.Stats())
	}
}
