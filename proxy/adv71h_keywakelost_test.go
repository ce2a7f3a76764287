package proxy

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/orbitpool"
)

// TestAdv71hIdleH2WakeLostWithKeyWaiter: the end of an h2c connection's
// last stream is room for any paused request (the connection may be
// evicted), but signalKey wakes a waiter of the connection's key first,
// for roomStream. If that waiter leaves without using the room (its
// context ends as it wakes), the wake it passes on is a roomStream one,
// which only the key's waiters may take (wakeNext walks byKey): a paused
// request of another key, which could have evicted the idle connection,
// sleeps out its pause. A table of two slots holds an HTTP/1.1 connection
// with a held exchange and X, an h2c connection of key K (one stream at
// most) with a held stream. WA (capped HTTP/1.1, key L) and WK (key K)
// pause for room, only wakes serving them (fullPauseBase a minute). X's
// stream ends and WK's context is canceled at once. Asserted: WA is
// served within its 4s deadline, whichever way WK went (served on X, or
// canceled).
func TestAdv71hIdleH2WakeLostWithKeyWaiter(t *testing.T) {
	for trial := range 10 {
		if adv71hKeyWakeTrial(t, trial) {
			return // WK canceled as woken, and WA was served all the same
		}
	}
}

// adv71hKeyWakeTrial runs one trial, and reports whether WK ended canceled
// before it had a connection (an "acquire" error: the case that shows the
// bug; otherwise WK won the race and took X, whose end then wakes WA).
func adv71hKeyWakeTrial(t *testing.T, trial int) bool {
	spec := orbitpool.PoolSpec{Lanes: 1, Keys: 16, ResourcesPerLane: 2}
	relO, h2release := make(chan struct{}), make(chan struct{})
	var o1, o2 sync.Once
	closeO := func() { o1.Do(func() { close(relO) }) }
	endH2 := func() { o2.Do(func() { close(h2release) }) }
	defer closeO()
	defer endH2()
	s := h2cHoldServer(t, h2release, 1)
	m := newMember(t, spec, nil)
	holdStreams(t, m, closingStreamUpstream(t, relO, false), 1)
	hk := &Transport{Node: m.node, H2C: true, HTTP2: true, fullPauseBase: time.Minute}
	req, _ := http.NewRequest("GET", s.url+"/hold", nil)
	heldH2, err := hk.RoundTrip(req)
	if err != nil {
		t.Fatalf("trial %d: the held h2c stream: %v", trial, err)
	}
	defer heldH2.Body.Close()
	if st := m.node.Stats(); st.OpenConns != 2 {
		t.Fatalf("trial %d: want a full table of two connections: %+v", trial, st)
	}
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
	waitFor(t, 3*time.Second, "WA to pause", func() bool { return m.node.room.n.Load() == 1 })
	kctx, kcancel := context.WithTimeout(context.Background(), 4*time.Second)
	defer kcancel()
	wkErr := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(kctx, "GET", s.url+"/", nil)
		resp, err := hk.RoundTrip(req)
		if err == nil {
			drain(resp)
		}
		wkErr <- err
	}()
	waitFor(t, 3*time.Second, "WK to pause", func() bool { return m.node.room.n.Load() == 2 })
	time.Sleep(20 * time.Millisecond)
	endH2()
	drain(heldH2) // its end (signalKey) runs in the read that sees EOF
	kcancel()
	wk := <-wkErr
	err = <-waErr
	if err != nil {
		closeO()
		t.Fatalf("trial %d: WA (key L), paused (only wakes serve) when X's last stream ended, WK (key K) woken for it and canceled (WK: %v): %v (stats %+v); want WA woken and served by evicting idle X",
			trial, wk, err, m.node.Stats())
	}
	return wk != nil && strings.Contains(wk.Error(), "acquire")
}
