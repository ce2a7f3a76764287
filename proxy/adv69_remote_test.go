package proxy

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/orbitpool"
)

// TestAdv69FullWaitTakesSiblingConnection: A's lane is full of another
// upstream's exchanges; the capped upstream K's only connection is B's,
// busy. A's request to K waits, and once B's connection frees it is served
// on it (a remote reuse), with nothing dialed outside the table.
func TestAdv69FullWaitTakesSiblingConnection(t *testing.T) {
	spec := orbitpool.PoolSpec{Lanes: 2, Keys: 4, ResourcesPerLane: 2, Path: filepath.Join(t.TempDir(), "seg")}
	relA, closedA := make(chan struct{}), make(chan bool, 16)
	defer close(relA)
	relK, closedK := make(chan struct{}), make(chan bool, 16)
	other := unpooledUpstream(t, relA, closedA)
	k := unpooledUpstream(t, relK, closedK)
	capped := func(tr *Transport) { tr.MaxConnsPerKey = 8 }
	a := newMember(t, spec, capped)
	b := newMember(t, spec, capped)
	holdStreams(t, a, other, 2)
	held := holdStreams(t, b, k, 1)
	type result struct {
		body string
		err  error
	}
	done := make(chan result, 1)
	go func() {
		body, err := adv69Get(a.tr, k+"/once", 5*time.Second)
		done <- result{body, err}
	}()
	select {
	case r := <-done:
		t.Fatalf("A's request returned (%q, %v) while K's one connection was busy", r.body, r.err)
	case <-time.After(300 * time.Millisecond):
	}
	close(relK)
	drain(held[0])
	r := <-done
	if r.err != nil || r.body != "ok" {
		t.Fatalf("A's request after B's connection freed: %q, %v", r.body, r.err)
	}
	if s := a.node.Stats(); s.ReusedRemote != 1 || s.Unpooled != 0 || s.Created != 2 {
		t.Fatalf("A's stats %+v: want the request on B's connection", s)
	}
}
