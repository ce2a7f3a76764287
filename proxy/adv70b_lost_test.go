package proxy

import (
	"errors"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/orbitpool"
)

// TestAdv70bWokenDialFailsPassesOn: two requests pause for room in a table
// of two slots full of held streams: the older to an upstream that refuses
// connections, the younger to a live one (both capped, and every pause
// outlasts the deadlines: only a wake serves them). One held stream's
// connection then leaves the table: one event, which wakes the older. Its
// dial fails, and the room it was woken for is free again; the younger must
// be woken for it, not left to its deadline.
func TestAdv70bWokenDialFailsPassesOn(t *testing.T) {
	spec := orbitpool.PoolSpec{Lanes: 1, Keys: 16, ResourcesPerLane: 2}
	leave, stay := make(chan struct{}), make(chan struct{})
	defer close(stay)
	closeLeave := func() {
		select {
		case <-leave:
		default:
			close(leave)
		}
	}
	defer closeLeave()
	m := newMember(t, spec, nil)
	held := holdStreams(t, m, closingStreamUpstream(t, leave, true), 1)
	holdStreams(t, m, closingStreamUpstream(t, stay, false), 1)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + ln.Addr().String()
	ln.Close()
	live := closingStreamUpstream(t, nil, false)
	wt := &Transport{Node: m.node, MaxConnsPerKey: 8, fullPauseBase: time.Minute}
	deadErr := make(chan error, 1)
	go func() {
		_, _, err := roundTripWithin(wt, dead+"/", 8*time.Second)
		deadErr <- err
	}()
	waitFor(t, 3*time.Second, "the first request to pause", func() bool { return m.node.room.n.Load() == 1 })
	liveErr := make(chan error, 1)
	go func() {
		_, body, err := roundTripWithin(wt, live+"/", 4*time.Second)
		if err == nil && body != "ok" {
			err = errors.New("body " + body)
		}
		liveErr <- err
	}()
	waitFor(t, 3*time.Second, "the second request to pause", func() bool { return m.node.room.n.Load() == 2 })
	closeLeave()
	drain(held[0])
	start := time.Now()
	if err := <-deadErr; err == nil {
		t.Fatal("the request to a refusing upstream was served")
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("the request to a refusing upstream failed %v after the event; want it woken by it", d)
	}
	err = <-liveErr
	if w := m.node.room.n.Load(); w != 0 {
		t.Errorf("%d waiters left queued", w)
	}
	if err != nil {
		t.Fatalf("the younger paused request, with room in the table once the older's dial failed: %v (stats %+v); want it woken and served", err, m.node.Stats())
	}
	_ = http.MethodGet
}

// TestAdv70bFailedDialFreesRoomWakes: a table of two slots holds a held
// stream, and a dial of another request (to a TLS upstream that closes
// every connection during the handshake, after a while). A capped request
// then finds the table full and pauses (every pause outlasts its
// deadline). The dial fails and its creation permit is closed: the slot is
// free, as if a connection had left the table. The paused request must be
// woken for it, not left to its deadline.
func TestAdv70bFailedDialFreesRoomWakes(t *testing.T) {
	spec := orbitpool.PoolSpec{Lanes: 1, Keys: 16, ResourcesPerLane: 2}
	release := make(chan struct{})
	defer close(release)
	m := newMember(t, spec, nil)
	holdStreams(t, m, closingStreamUpstream(t, release, false), 1)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	var accepted atomic.Int32
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			go func() {
				time.Sleep(300 * time.Millisecond)
				c.Close()
			}()
		}
	}()
	failing := &Transport{Node: m.node}
	failErr := make(chan error, 1)
	go func() {
		_, _, err := roundTripWithin(failing, "https://"+ln.Addr().String()+"/", 3*time.Second)
		failErr <- err
	}()
	waitFor(t, 3*time.Second, "the dial to begin", func() bool { return accepted.Load() >= 1 })
	wt := &Transport{Node: m.node, MaxConnsPerKey: 8, fullPauseBase: time.Minute}
	live := closingStreamUpstream(t, nil, false)
	liveErr := make(chan error, 1)
	go func() {
		_, body, err := roundTripWithin(wt, live+"/", 5*time.Second)
		if err == nil && body != "ok" {
			err = errors.New("body " + body)
		}
		liveErr <- err
	}()
	waitFor(t, 3*time.Second, "the capped request to pause", func() bool { return m.node.room.n.Load() == 1 })
	if err := <-failErr; err == nil {
		t.Fatal("the request to a failing TLS upstream was served")
	}
	err = <-liveErr
	if w := m.node.room.n.Load(); w != 0 {
		t.Errorf("%d waiters left queued", w)
	}
	if err != nil {
		t.Fatalf("the paused request, with room in the table once the failed dial's permit closed: %v (stats %+v); want it woken and served", err, m.node.Stats())
	}
}
