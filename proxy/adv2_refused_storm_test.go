package proxy

import (
	"context"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// TestAdv2RefusedDropStormWithAForeignOrphan: TestAdvRefusedDroppedRequest
// FailsFast (10 concurrent GETs the upstream drops at once, a cap of 2,
// each must be sent once and fail at once), with one orphan to the same
// upstream address left by another process of the same user.
func TestAdv2RefusedDropStormWithAForeignOrphan(t *testing.T) {
	up := startAdv2Upstream(t, 20*time.Second)
	spec := testSpec
	spec.Path = filepath.Join(t.TempDir(), "seg")
	m := newMemberOpts(t, spec, NodeOptions{SweepInterval: 50 * time.Millisecond},
		func(tr *Transport) { tr.MaxConnsPerKey = 2 })
	adv2ForeignOrphan(t, up)

	const n = 10
	var wg sync.WaitGroup
	var mu sync.Mutex
	var slowest time.Duration
	conns0 := up.conns.Load()
	for range n {
		wg.Go(func() {
			s := time.Now()
			ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
			defer cancel()
			getBody(ctx, m.tr, up.url+"/drop")
			mu.Lock()
			slowest = max(slowest, time.Since(s))
			mu.Unlock()
		})
	}
	wg.Wait()
	t.Logf("%d concurrent GET /drop: slowest failed after %v; upstream saw %d requests on %d connections; UpstreamRefused=%d",
		n, slowest.Round(time.Millisecond), up.count("/drop"), up.conns.Load()-conns0, m.node.Stats().UpstreamRefused)
	if got := up.count("/drop"); got > n {
		t.Errorf("%d GETs dropped by the upstream were sent %d times", n, got)
	}
	if slowest > time.Second {
		t.Errorf("GETs the upstream drops at once took up to %v to fail", slowest.Round(time.Millisecond))
	}
}
