package proxy

import (
	"errors"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/orbitpool"
)

// TestAdv71eIdleH2NotEvictedForOtherKey: a table of two slots holds an
// HTTP/1.1 connection with a held exchange, and an h2c connection of key K
// with one held stream. WA, a capped HTTP/1.1 request to a third upstream
// (key L), pauses for room. The held h2c stream then ends: the h2c
// connection carries no stream at all and sits idle. As an idle HTTP/1.1
// connection would be, it is evicted for WA, and its last stream's end
// wakes WA to do so: WA must be served within its 4s deadline rather than
// fail "table full" while a slot holds a connection nobody uses (until the
// idle sweep, 90s). With ordinary pauses, and with only wakes to serve WA
// (its pauses a minute long).
func TestAdv71eIdleH2NotEvictedForOtherKey(t *testing.T) {
	for _, pause := range []time.Duration{0, time.Minute} {
		t.Run(pause.String(), func(t *testing.T) {
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
			wa := &Transport{Node: m.node, MaxConnsPerKey: 8, fullPauseBase: pause}
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
			if err := <-waErr; err != nil {
				closeO()
				t.Fatalf("WA, with the h2c connection idle (no stream) since its last stream ended: %v (stats %+v); want it woken and served by evicting the idle h2c connection", err, m.node.Stats())
			}
		})
	}
}
