package proxy

import (
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/orbitpool"
)

// TestAdv74aFullTablePaidFallbackPause: the client's lane is full of busy
// streams (two slots); it owes a dial of X (relaysPerDial relays through
// the owner's connection), and MaxDialingPerKey 1 keeps it off connections
// outside the table. The owner's one X connection is busy. The client's
// requests to X find the paid dial without room, fall back, find no idle
// connection anywhere and no room, and pause. Properties: one with a short
// deadline ends by it (plus a grace) with a retry-safe no-capacity error;
// one with a long deadline is served soon after the owner's connection
// goes idle (room a sibling makes is found at the end of a pause, at most
// ~90ms); nothing is left queued for room, and counts settle.
func TestAdv74aFullTablePaidFallbackPause(t *testing.T) {
	spec := orbitpool.PoolSpec{Lanes: 2, Keys: 16, ResourcesPerLane: 2, Path: filepath.Join(t.TempDir(), "seg")}
	conf := func(tr *Transport) { tr.MaxDialingPerKey = 1 }
	owner, client := newMember(t, spec, conf), newMember(t, spec, conf)
	release := make(chan struct{})
	released := false
	defer func() {
		if !released {
			close(release)
		}
	}()
	streams := closingStreamUpstream(t, release, false)
	hold, entered := make(chan struct{}), make(chan struct{}, 1)
	holdOpen := true
	defer func() {
		if holdOpen {
			close(hold)
		}
	}()
	x, _ := adv72bHoldUpstream(t, hold, entered)
	warm(t, owner, x.URL)
	for i := range relaysPerDial {
		if _, _, err := adv10Do(t, client.tr, "GET", x.URL, nil); err != nil {
			t.Fatalf("relay %d: %v", i, err)
		}
	}
	holdStreams(t, client, streams, 2)
	ownerDone := make(chan error, 1)
	go func() {
		_, _, err := adv10Do(t, owner.tr, "GET", x.URL+"/hold", nil)
		ownerDone <- err
	}()
	<-entered
	type res struct {
		err  error
		took time.Duration
	}
	short, long := make(chan res, 1), make(chan res, 1)
	for _, c := range []struct {
		d  time.Duration
		ch chan res
	}{{250 * time.Millisecond, short}, {3 * time.Second, long}} {
		go func() {
			start := time.Now()
			_, _, err := roundTripWithin(client.tr, x.URL+"/", c.d)
			c.ch <- res{err, time.Since(start)}
		}()
	}
	r := <-short
	if r.took > 250*time.Millisecond+200*time.Millisecond {
		t.Errorf("short request ended after %v (err %v)", r.took.Round(time.Millisecond), r.err)
	}
	if r.err == nil {
		t.Errorf("short request served with every connection busy and no room")
	} else if !IsRetrySafe(r.err) || !errors.Is(r.err, ErrNoCapacity) {
		t.Errorf("short request: %v; want a retry-safe ErrNoCapacity", r.err)
	}
	time.Sleep(100 * time.Millisecond)
	freed := time.Now()
	close(hold)
	holdOpen = false
	if err := <-ownerDone; err != nil {
		t.Fatalf("owner's held request: %v", err)
	}
	select {
	case r = <-long:
		if r.err != nil {
			t.Errorf("long request: %v after %v (client %+v)", r.err, r.took.Round(time.Millisecond), client.node.Stats())
		} else if d := time.Since(freed); d > 400*time.Millisecond {
			t.Errorf("long request served %v after the owner's connection went idle", d.Round(time.Millisecond))
		}
	case <-time.After(4 * time.Second):
		t.Fatalf("long request still running")
	}
	if n := client.node.room.n.Load(); n != 0 {
		t.Errorf("%d requests still queued for room", n)
	}
	close(release)
	released = true
	adv72bSettled(t, client, x.URL)
}
