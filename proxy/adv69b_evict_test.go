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

// adv69bGate is LocalFirst whose second decision waits for proceed, after
// telling blocked: a test's hook between a request's eviction and its next
// ask of the pool.
type adv69bGate struct {
	calls   atomic.Int32
	blocked chan struct{}
	proceed chan struct{}
}

func (g *adv69bGate) Decide(v *orbitpool.View) orbitpool.Decision {
	if g.calls.Add(1) == 2 {
		close(g.blocked)
		<-g.proceed
	}
	return orbitpool.LocalFirst{}.Decide(v)
}

// TestAdv69bPauseEvictsAgain: a capped key's request finds the table full
// of another key's idle connections and a busy one. It evicts one idle
// connection, but another request takes the room first. While it pauses,
// the table still holds an idle connection it could retire for room, as
// it did the first: it must get room (by evicting it) before its deadline,
// rather than pause (1.5s here) with an idle connection in the way.
func TestAdv69bPauseEvictsAgain(t *testing.T) {
	release := make(chan struct{})
	relOnce := sync.OnceFunc(func() { close(release) })
	defer relOnce()
	relA := make(chan struct{})
	relAOnce := sync.OnceFunc(func() { close(relA) })
	defer relAOnce()
	gate := &adv69bGate{blocked: make(chan struct{}), proceed: make(chan struct{})}
	proceed := sync.OnceFunc(func() { close(gate.proceed) })
	defer proceed()

	upX, _ := newAdv69bUpstream(t, false, adv69bAnswer(release))
	upA, _ := newAdv69bUpstream(t, false, adv69bAnswer(relA))
	upY, _ := newAdv69bUpstream(t, false, adv69bAnswer(release))
	upK, _ := newAdv69bUpstream(t, false, adv69bAnswer(release))
	spec := orbitpool.PoolSpec{Lanes: 1, Keys: 8, ResourcesPerLane: 3}
	m := newMemberOpts(t, spec, NodeOptions{SweepInterval: time.Hour}, nil)
	b := m.tr
	k := &Transport{Node: m.node, MaxConnsPerKey: 4, Policy: gate}

	adv69bHold(t, b, upX.url, 1)
	drainA := adv69bHold(t, b, upA.url, 2)
	relAOnce()
	drainA() // A's two connections idle in the table, which is full

	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", upK.url+"/x", nil)
		resp, err := k.RoundTrip(req)
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		done <- err
	}()
	select {
	case <-gate.blocked:
	case <-time.After(3 * time.Second):
		t.Fatal("the capped request never asked the pool a second time")
	}
	if s := m.node.Stats(); s.Evicted != 1 {
		t.Fatalf("stats %+v: want one eviction before the second ask", s)
	}
	// Another request takes the room.
	adv69bHold(t, b, upY.url, 1)
	proceed()
	start := time.Now()
	err := <-done
	took := time.Since(start)
	if err != nil || took > 500*time.Millisecond {
		t.Fatalf("the capped request, with an idle connection of another key in the table all along: %v after %v more (evictions %d, retries %d); want it served at once", err, took, m.node.Stats().Evicted, m.node.Stats().Retries)
	}
}
