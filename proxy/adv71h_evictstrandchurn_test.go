package proxy

import (
	"context"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/orbitpool"
)

// TestAdv71hH2EvictChurnNoStrandedDrain: streams to an h2c upstream (key
// K) end while capped HTTP/1.1 requests (key J) evict from a table of two
// slots. A stream's end drops the connection's count of streams before it
// completes its unit in the pool (useH2's end: active, syncH2, Complete):
// an eviction that reads the table's users between the two finds a user,
// passes the connection over after stopping its offers for good, and the
// stream's syncH2, already run, does not retire it. With the sweep a
// minute away, nothing else does. Asserted, once the churn is over: within
// 2s no connection is left in h2slots draining with no stream (it would
// hold its slot until the sweep), each request got its answer or a
// retry-safe error, and the open count matches the slots.
func TestAdv71hH2EvictChurnNoStrandedDrain(t *testing.T) {
	spec := orbitpool.PoolSpec{Lanes: 1, Keys: 16, ResourcesPerLane: 2}
	s := newH2CServer(t, func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ok")
	}, 8)
	jURL := closingStreamUpstream(t, nil, false)
	m := newMemberOpts(t, spec, NodeOptions{SweepInterval: time.Minute}, nil)
	hk := &Transport{Node: m.node, H2C: true, HTTP2: true, fullPauseBase: 2 * time.Millisecond}
	hj := &Transport{Node: m.node, MaxConnsPerKey: 4, fullPauseBase: 2 * time.Millisecond}
	var bad atomic.Value
	var wg sync.WaitGroup
	stop := time.Now().Add(2500 * time.Millisecond)
	run := func(tr *Transport, url string) {
		defer wg.Done()
		for time.Now().Before(stop) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
			resp, err := tr.RoundTrip(req)
			if err == nil {
				b, rerr := io.ReadAll(resp.Body)
				resp.Body.Close()
				if rerr != nil || string(b) != "ok" {
					bad.CompareAndSwap(nil, "body "+string(b))
				}
			} else if pe, ok := err.(*Error); !ok || !pe.RetrySafe {
				bad.CompareAndSwap(nil, "not retry-safe: "+err.Error())
			}
			cancel()
		}
	}
	for range 3 {
		wg.Add(2)
		go run(hk, s.url+"/")
		go run(hj, jURL+"/")
	}
	wg.Wait()
	if v := bad.Load(); v != nil {
		t.Fatalf("a request during the churn: %v", v)
	}
	stranded := func() (n int, what string) {
		for i := range m.node.h2slots {
			if c := m.node.h2slots[i].Load(); c != nil && c.isDraining() && c.active.Load() == 0 {
				u, err := m.pool.Users(c.id)
				if err == nil && u == 0 {
					n++
					what = c.id.String()
				}
			}
		}
		return n, what
	}
	deadline := time.Now().Add(2 * time.Second)
	n, what := stranded()
	for n != 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
		n, what = stranded()
	}
	if n != 0 {
		t.Fatalf("%d HTTP/2 connection(s) (%s) draining with no stream and no user, still in h2slots 2s after the churn (stats %+v); want them retired", n, what, m.node.Stats())
	}
	t.Logf("stats after churn: %+v", m.node.Stats())
	slots := 0
	for i := range m.node.slots {
		if m.node.slots[i].Load() != nil {
			slots++
		}
	}
	for i := range m.node.h2slots {
		if m.node.h2slots[i].Load() != nil {
			slots++
		}
	}
	if open := m.node.open.Load(); int(open) != slots {
		t.Fatalf("open count %d, connections in slots %d", open, slots)
	}
}
