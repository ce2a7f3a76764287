package proxy

import (
	"context"
	"errors"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/orbitpool"
)

// TestAdv71hH2EvictPassedOverLeaseWithdrawn: evictIdle passes over an
// HTTP/2 connection that the table says someone holds (Users: uses plus
// pending reservations), after it has stopped its offers for good: "it
// leaves once its streams have ended". A sibling's pending reservation is
// such a hold, yet it may end with no stream: the sibling withdraws its
// lease when the request is not delivered (Transport.once does so on any
// error of peers.roundTrip, as does a sibling whose context ends). A
// connection drained when passed over would have no stream end to retire
// it, and keep its table slot until the next sweep; so it is passed over
// without a drain, and stays offered.
//
// Owner A's lane has two slots: X, an h2c connection of key K with no
// stream, and Y, an HTTP/1.1 connection with a held exchange. Sibling B
// reserves a lease on X (pool.Acquire, as its transport does) and holds
// it. E, a capped HTTP/1.1 request on A (key J), finds the table full,
// evictIdle passes X over (B's reservation), and E pauses (A's sweep a
// minute away). B withdraws its lease: an event in B's process, which E
// finds at the end of a pause, as it finds all room a sibling makes.
// Asserted: X is not drained when passed over; X leaves A's table, and E
// is served, within E's 4s deadline.
func TestAdv71hH2EvictPassedOverLeaseWithdrawn(t *testing.T) {
	spec := orbitpool.PoolSpec{Lanes: 2, Keys: 16, ResourcesPerLane: 2, Path: filepath.Join(t.TempDir(), "seg")}
	relO, h2release := make(chan struct{}), make(chan struct{})
	var o1, o2 sync.Once
	closeO := func() { o1.Do(func() { close(relO) }) }
	endH2 := func() { o2.Do(func() { close(h2release) }) }
	defer closeO()
	defer endH2()
	s := h2cHoldServer(t, h2release, 8)
	a := newMemberOpts(t, spec, NodeOptions{SweepInterval: time.Minute}, nil)
	b := newMemberOpts(t, spec, NodeOptions{SweepInterval: time.Minute}, nil)
	hk := &Transport{Node: a.node, H2C: true, HTTP2: true, MaxConnsPerKey: 1, fullPauseBase: time.Minute}
	if _, body, err := roundTripWithin(hk, s.url+"/", 2*time.Second); err != nil || body != "ok" {
		t.Fatalf("X's first stream: %q %v", body, err)
	}
	holdStreams(t, a, closingStreamUpstream(t, relO, false), 1)
	var x *h2conn
	for i := range a.node.h2slots {
		if c := a.node.h2slots[i].Load(); c != nil {
			x = c
		}
	}
	if st := a.node.Stats(); st.OpenConns != 2 || x == nil || x.active.Load() != 0 || !x.ended.Load() {
		t.Fatalf("want A's lane full with X, an h2c connection with no stream: %+v", st)
	}
	// B reserves a lease on X, as its transport's Acquire would.
	bctx, bcancel := context.WithTimeout(context.Background(), 2*time.Second)
	plan, err := b.pool.Acquire(bctx, x.key, orbitpool.LocalFirst{}, orbitpool.Limits{MaxResources: 1, MaxCreating: 1})
	bcancel()
	if err != nil || plan.Kind != orbitpool.PlanReuseRemote {
		if err == nil && plan.Execution != nil {
			plan.Execution.Complete()
		}
		t.Fatalf("B's acquire on K: plan %v, err %v; want a lease on X", plan.Kind, err)
	}
	withdrawn := false
	withdraw := func() {
		if !withdrawn {
			withdrawn = true
			b.pool.Withdraw(plan.Lease)
		}
	}
	defer withdraw()
	if u, err := a.pool.Users(x.id); err != nil || u != 1 {
		t.Fatalf("X's users with B's lease pending: %d %v", u, err)
	}
	he := &Transport{Node: a.node, MaxConnsPerKey: 4}
	jURL := closingStreamUpstream(t, nil, false)
	eCh := make(chan error, 1)
	go func() {
		_, body, err := roundTripWithin(he, jURL+"/", 4*time.Second)
		if err == nil && body != "ok" {
			err = errors.New("body " + body)
		}
		eCh <- err
	}()
	waitFor(t, 3*time.Second, "E to pause", func() bool { return a.node.room.n.Load() == 1 })
	if x.isDraining() || a.node.lookupH2(x.id) != x || a.node.Stats().Evicted != 0 {
		closeO()
		<-eCh
		t.Fatalf("want X passed over by E's eviction, not drained and still in its slot: draining %v, evicted %d", x.isDraining(), a.node.Stats().Evicted)
	}
	withdraw() // B's request was not delivered: its lease goes back
	start := time.Now()
	for a.node.lookupH2(x.id) == x && time.Since(start) < 3*time.Second {
		time.Sleep(5 * time.Millisecond)
	}
	left := a.node.lookupH2(x.id) != x
	err = <-eCh
	if !left || err != nil {
		closeO()
		u, uerr := a.pool.Users(x.id)
		t.Fatalf("X passed over for B's lease, then the lease withdrawn: X left A's table %v (draining %v, streams %d, users %d %v); E: %v (stats %+v); want X gone and E served",
			left, x.isDraining(), x.active.Load(), u, uerr, err, a.node.Stats())
	}
}
