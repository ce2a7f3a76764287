package proxy

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/orbitpool"
)

// TestAdv71iH2PassOverChurnCappedKeyServed: key K (h2c, MaxConnsPerKey 1)
// runs streams back to back on its one connection X while capped HTTP/1.1
// requests (key J) evict from a table of two slots: each eviction that
// picks X between two of K's streams pauses it and, finding a holder,
// passes it over and resyncs it. Asserted: every request of K is served
// (X could serve each of them: 8 streams, 3 callers) and J's get an answer
// or a retry-safe error; K never has more than one connection in h2slots
// (its cap); and after the churn, within 2s, no connection is left paused
// (capacity 0, not draining) with no read of its state in flight.
func TestAdv71iH2PassOverChurnCappedKeyServed(t *testing.T) {
	spec := orbitpool.PoolSpec{Lanes: 1, Keys: 16, ResourcesPerLane: 2}
	s := newH2CServer(t, func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ok")
	}, 8)
	jURL := closingStreamUpstream(t, nil, false)
	m := newMemberOpts(t, spec, NodeOptions{SweepInterval: time.Minute}, nil)
	hk := &Transport{Node: m.node, H2C: true, HTTP2: true, MaxConnsPerKey: 1, fullPauseBase: 2 * time.Millisecond}
	hj := &Transport{Node: m.node, MaxConnsPerKey: 4, fullPauseBase: 2 * time.Millisecond}
	var bad atomic.Value
	var kServed, kFailed, jServed, jFailed atomic.Int64
	var wg sync.WaitGroup
	stop := time.Now().Add(2500 * time.Millisecond)
	run := func(tr *Transport, url string, isK bool) {
		defer wg.Done()
		for time.Now().Before(stop) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
			resp, err := tr.RoundTrip(req)
			if err == nil {
				b, rerr := io.ReadAll(resp.Body)
				resp.Body.Close()
				if rerr != nil || string(b) != "ok" {
					bad.CompareAndSwap(nil, fmt.Sprintf("body %q %v", b, rerr))
				}
				if isK {
					kServed.Add(1)
				} else {
					jServed.Add(1)
				}
			} else {
				if pe, ok := err.(*Error); !ok || !pe.RetrySafe {
					bad.CompareAndSwap(nil, "not retry-safe: "+err.Error())
				}
				if isK {
					kFailed.Add(1)
					bad.CompareAndSwap(nil, "K unserved: "+err.Error())
				} else {
					jFailed.Add(1)
				}
			}
			cancel()
		}
	}
	var maxK, seenPaused atomic.Int64
	monStop := make(chan struct{})
	monDone := make(chan struct{})
	go func() {
		defer close(monDone)
		for {
			k := int64(0)
			for i := range m.node.h2slots {
				if c := m.node.h2slots[i].Load(); c != nil {
					k++
					if !c.isDraining() && !c.offered() {
						seenPaused.Add(1)
					}
				}
			}
			if k > maxK.Load() {
				maxK.Store(k)
			}
			select {
			case <-monStop:
				return
			case <-time.After(200 * time.Microsecond):
			}
		}
	}()
	for range 3 {
		wg.Add(2)
		go run(hk, s.url+"/", true)
		go run(hj, jURL+"/", false)
	}
	wg.Wait()
	close(monStop)
	<-monDone
	t.Logf("K served %d failed %d, J served %d failed %d, evicted %d, paused seen %d", kServed.Load(), kFailed.Load(), jServed.Load(), jFailed.Load(), m.node.Stats().Evicted, seenPaused.Load())
	if v := bad.Load(); v != nil {
		t.Fatalf("a request during the churn: %v (K served %d failed %d, J served %d failed %d, stats %+v)", v, kServed.Load(), kFailed.Load(), jServed.Load(), jFailed.Load(), m.node.Stats())
	}
	if k := maxK.Load(); k > 1 {
		t.Fatalf("K (MaxConnsPerKey 1) had %d connections in h2slots at once", k)
	}
	paused := func() (n int) {
		for i := range m.node.h2slots {
			if c := m.node.h2slots[i].Load(); c != nil && !c.isDraining() && !c.offered() && !c.syncing.Load() {
				n++
			}
		}
		return n
	}
	deadline := time.Now().Add(2 * time.Second)
	for paused() != 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := paused(); n != 0 {
		t.Fatalf("%d HTTP/2 connection(s) left paused (capacity 0, not draining, no read in flight) 2s after the churn (stats %+v)", n, m.node.Stats())
	}
}
