package proxy

import (
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/orbitpool"
)

// TestAdv70bWokenServedRemotePassesOn: process A's lane is full of two held
// streams. Two requests pause on A for room (every pause outlasts the
// deadlines): the older to upstream K, whose one connection, on sibling B,
// is busy; the younger to upstream J. B's connection to K then goes idle
// (B's event, not A's), and one of A's held connections leaves the table:
// one event on A, which wakes the older. It is served on B's connection,
// and the room on A is still free: the younger must be woken for it.
func TestAdv70bWokenServedRemotePassesOn(t *testing.T) {
	spec := orbitpool.PoolSpec{Lanes: 2, Keys: 16, ResourcesPerLane: 2, Path: filepath.Join(t.TempDir(), "seg")}
	leave, stay, kRelease := make(chan struct{}), make(chan struct{}), make(chan struct{})
	defer close(stay)
	closed := map[chan struct{}]bool{}
	closeOnce := func(c chan struct{}) {
		if !closed[c] {
			closed[c] = true
			close(c)
		}
	}
	defer closeOnce(leave)
	defer closeOnce(kRelease)
	conf := func(tr *Transport) { tr.MaxConnsPerKey = 8; tr.fullPauseBase = time.Minute }
	a := newMember(t, spec, conf)
	b := newMember(t, spec, conf)
	k := closingStreamUpstream(t, kRelease, false)
	j := closingStreamUpstream(t, nil, false)
	kHeld := holdStreams(t, b, k, 1)
	aHeld := holdStreams(t, &member{pool: a.pool, node: a.node, tr: &Transport{Node: a.node}}, closingStreamUpstream(t, leave, true), 1)
	holdStreams(t, &member{pool: a.pool, node: a.node, tr: &Transport{Node: a.node}}, closingStreamUpstream(t, stay, false), 1)
	kErr, jErr := make(chan error, 1), make(chan error, 1)
	do := func(url string, d time.Duration, out chan error) {
		_, body, err := roundTripWithin(a.tr, url+"/", d)
		if err == nil && body != "ok" {
			err = errors.New("body " + body)
		}
		out <- err
	}
	go do(k, 8*time.Second, kErr)
	waitFor(t, 3*time.Second, "the request to K to pause", func() bool { return a.node.room.n.Load() == 1 })
	go do(j, 4*time.Second, jErr)
	waitFor(t, 3*time.Second, "the request to J to pause", func() bool { return a.node.room.n.Load() == 2 })
	closeOnce(kRelease)
	drain(kHeld[0])
	waitFor(t, 3*time.Second, "B's connection to K to go idle", func() bool { return adv70Idle(b) == 1 })
	closeOnce(leave)
	drain(aHeld[0])
	if err := <-kErr; err != nil {
		t.Fatalf("the request to K: %v", err)
	}
	err := <-jErr
	if w := a.node.room.n.Load(); w != 0 {
		t.Errorf("%d waiters left queued", w)
	}
	if err != nil {
		t.Fatalf("the younger paused request, with room on A once the older was served on B: %v (A's stats %+v); want it woken and served", err, a.node.Stats())
	}
}
