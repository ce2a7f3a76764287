package proxy

import (
	"errors"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/orbitpool"
)

// TestAdv71gIdleH2WakesOtherKeyWaiter: TestAdv71eIdleH2NotEvictedForOtherKey
// with only wakes to serve (fullPauseBase a minute). A table of two slots
// holds an HTTP/1.1 connection with a held exchange and an h2c connection
// of key K with one held stream. WA, a capped HTTP/1.1 request to a third
// upstream (key L), pauses for room. The held h2c stream ends: the h2c
// connection has no stream, and evictIdle now evicts such a connection for
// any key. That is room for WA as much as an HTTP/1.1 connection going idle
// (roomIdle) is, so WA must be woken and served within its 4s deadline.
// A stream's end signals only roomStream for K (signalKey), which wakes
// K's waiters alone: WA, of L, sleeps out its pause.
func TestAdv71gIdleH2WakesOtherKeyWaiter(t *testing.T) {
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
		t.Fatalf("the held h2c stream: %v", err)
	}
	defer heldH2.Body.Close()
	if st := m.node.Stats(); st.OpenConns != 2 {
		t.Fatalf("want a full table of two connections: %+v", st)
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
	time.Sleep(50 * time.Millisecond)
	endH2()
	drain(heldH2)
	err = <-waErr
	if err != nil {
		closeO()
		t.Fatalf("WA, paused (only wakes serve) when the h2c connection's last stream ended: %v (stats %+v); want it woken and served by evicting the idle h2c connection", err, m.node.Stats())
	}
}
