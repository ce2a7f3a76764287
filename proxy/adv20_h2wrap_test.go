package proxy

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/internal/h2frame"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// TestAdv20H2SteadyLimitOneConn: an upstream whose stream limit never
// changes (4), and exactly 4 callers each running one request after another.
// Never more than 4 streams are wanted at once, so the one connection
// suffices: stock net/http and x/net's own client never dial a second one,
// and the pool's capacity for the connection should never go below the
// peer's 4 (the node logs "upstream changed its stream limit").
func TestAdv20H2SteadyLimitOneConn(t *testing.T) {
	const limit = 4
	up := h2frame.New(t, limit, 200*time.Microsecond)
	core, logs := observer.New(zapcore.DebugLevel)
	m := newMemberOpts(t, testSpecLocal, NodeOptions{SweepInterval: time.Hour, Logger: zap.New(core)}, h2cConf)
	if err := getOK(m, context.Background(), up.URL+"/"); err != nil {
		t.Fatal(err)
	}
	id := h2ID(t, m, up.URL)

	var off atomic.Int64 // capacity samples other than the limit
	seen := map[int]int{}
	stop := make(chan struct{})
	var sampler sync.WaitGroup
	sampler.Add(1)
	go func() {
		defer sampler.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if c, err := m.pool.Capacity(id); err == nil && c != limit {
				off.Add(1)
				seen[c]++
			}
			time.Sleep(20 * time.Microsecond)
		}
	}()

	var wg sync.WaitGroup
	var fails atomic.Int64
	var reqs atomic.Int64
	warmChanges := logs.FilterMessage("upstream changed its stream limit").Len()
	deadline := time.Now().Add(2 * time.Second)
	for range limit {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				if err := getOK(m, ctx, up.URL+"/"); err != nil {
					fails.Add(1)
				}
				cancel()
				reqs.Add(1)
			}
		}()
	}
	wg.Wait()
	close(stop)
	sampler.Wait()
	conns, _, _, viol := up.Stats()
	created := m.node.stats.created.Load()
	changes := logs.FilterMessage("upstream changed its stream limit").AllUntimed()[warmChanges:]
	var to, below []any
	for _, e := range changes {
		c := e.ContextMap()["to"]
		to = append(to, c)
		if n, ok := c.(int64); !ok || n < limit {
			below = append(below, c)
		}
	}
	t.Logf("h2Wrapped=%v requests=%d failures=%d conns=%d created=%d capacity samples off %d: %v followed=%d",
		h2Wrapped, reqs.Load(), fails.Load(), conns, created, off.Load(), seen, m.node.stats.followed.Load())
	// A capacity above the limit, on readings of x/net's wrapper that all
	// came high, is put right at the next sync; one below it sends
	// requests to dial connections that are not needed.
	if len(below) > 0 {
		t.Errorf("the pool's capacity went below the peer's steady limit of %d %d times (all changes: %v)", limit, len(below), to)
	}
	if len(viol) > 0 {
		t.Errorf("upstream saw the limit exceeded: %v", viol)
	}
	if fails.Load() > 0 {
		t.Errorf("%d requests failed", fails.Load())
	}
	if conns != 1 || created != 1 {
		t.Errorf("%d connections dialed (%d created) for %d callers under a steady limit of %d; want 1", conns, created, limit, limit)
	}
}
