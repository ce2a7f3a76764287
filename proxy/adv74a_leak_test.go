package proxy

import (
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/orbitpool"
)

// adv74aOrbitGoroutines returns the stacks of goroutines running code of
// the proxy or orbitpool packages, other than the test's own.
func adv74aOrbitGoroutines() []string {
	buf := make([]byte, 8<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var out []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "proxy.Test") || strings.Contains(g, "proxy.adv74a") || strings.Contains(g, "testing.tRunner") && !strings.Contains(g, "orbit/proxy.(") {
			continue
		}
		if strings.Contains(g, "orbit/proxy.") || strings.Contains(g, "orbit/orbitpool.") {
			out = append(out, g)
		}
	}
	return out
}

// TestAdv74aNoLeakAfterClose: three processes on a small table (two slots
// a lane, so requests evict, pause and go outside the table) relay and pay
// for dials of their own for 800ms; then every process closes (Node, then
// pool) with requests still running. Properties: every request ends by its
// deadline plus a grace, and within 2s of the last Close no goroutine of the
// proxy or the pool is left.
func TestAdv74aNoLeakAfterClose(t *testing.T) {
	if g := adv74aOrbitGoroutines(); len(g) != 0 {
		time.Sleep(time.Second) // an earlier test's stragglers
	}
	base := len(adv74aOrbitGoroutines())
	ups := []string{discardUpstream(t).URL, discardUpstream(t).URL, discardUpstream(t).URL}
	spec := orbitpool.PoolSpec{Lanes: 4, Keys: 8, ResourcesPerLane: 2, Path: filepath.Join(t.TempDir(), "seg")}
	var ms []*member
	for range 3 {
		ms = append(ms, newMember(t, spec, nil))
	}
	capped := &Transport{Node: ms[2].node, MaxConnsPerKey: 2}
	stop := time.Now().Add(800 * time.Millisecond)
	var wg sync.WaitGroup
	var n atomic.Int64
	for w := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var rt *Transport = ms[w%3].tr
			if w == 5 {
				rt = capped
			}
			for i := 0; ; i++ {
				if time.Now().After(stop.Add(200 * time.Millisecond)) {
					return
				}
				start := time.Now()
				_, _, err := roundTripWithin(rt, ups[(i/5+w)%len(ups)]+"/", 500*time.Millisecond)
				n.Add(1)
				if d := time.Since(start); d > 800*time.Millisecond {
					t.Errorf("worker %d: request took %v (err %v)", w, d.Round(time.Millisecond), err)
				}
			}
		}()
	}
	time.Sleep(time.Until(stop))
	for _, m := range ms {
		m.node.Close()
		m.pool.Close()
	}
	wg.Wait()
	var left []string
	for end := time.Now().Add(2 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		left = adv74aOrbitGoroutines()
		if len(left) <= base || time.Now().After(end) {
			break
		}
	}
	t.Logf("%d requests", n.Load())
	if len(left) > base {
		t.Errorf("%d goroutines of the proxy or pool left 2s after Close (%d before):\n%s", len(left), base, strings.Join(left, "\n\n"))
	}
}
