package fleet

import (
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/zap"
)

// TestAdv40LateRefusalLeavesNoWorkerBehind: a worker holds two loads that
// timed out, reloads to gen 2 and 3, which the other worker accepted (the
// fleet runs gen 3). Their late answers are refusals, and reach the
// supervisor out of order (they may): gen 3's first, whose retry finds the
// worker still holding gen 2's load and passes it over, then gen 2's. The
// worker then holds nothing and runs gen 1, behind the fleet: it must be
// caught up, now or by a retry armed for it, not left on gen 1 until some
// unrelated event.
func TestAdv40LateRefusalLeavesNoWorkerBehind(t *testing.T) {
	timedOut := fmt.Errorf("%w: test", errLoadTimeout)
	refusedErr := errors.New("refused by the test")
	dir := t.TempDir()
	s := &supervisor{config: []byte(`{"v":1}`), cfgGen: 1, genSeq: 3, events: make(chan event, 64), log: zap.NewNop(), sockets: &fleetSockets{fds: map[string]int{}}, retryMin: time.Hour}
	w := &worker{id: 0, gen: 1, cfgGen: 1, running: true, ready: true, loads: 2, sock: filepath.Join(dir, "w0.sock")}
	a := &worker{id: 1, gen: 1, cfgGen: 1, running: true, ready: true, loads: 2, sock: filepath.Join(dir, "w1.sock")}
	s.workers = []*worker{w, a}
	stopRetry := func() {
		if s.retryTimer != nil {
			s.retryTimer.Stop()
			s.retryTimer = nil
		}
	}
	defer stopRetry()
	fire := func() { // what evRetryRefused does
		stopRetry()
		s.retryRefused()
	}
	for seq, gen := range []int{2, 3} {
		cfg := fmt.Appendf(nil, `{"v":%d}`, gen)
		s.reloaded(event{kind: evReloaded, config: cfg, gen: gen, loads: []loadResult{
			{id: 0, gen: 1, seq: seq + 1, cfgGen: gen, err: timedOut},
			{id: 1, gen: 1, seq: seq + 1, cfgGen: gen},
		}})
	}
	if s.cfgGen != 3 || !w.holding() {
		t.Fatalf("after both reloads: fleet gen %d, worker 0 holding %v; want 3, true", s.cfgGen, w.holding())
	}
	fire()
	s.lateLoaded(event{kind: evLateLoad, config: []byte(`{"v":3}`), late: loadResult{id: 0, gen: 1, seq: 2, cfgGen: 3, err: refusedErr}})
	fire()
	s.lateLoaded(event{kind: evLateLoad, config: []byte(`{"v":2}`), late: loadResult{id: 0, gen: 1, seq: 1, cfgGen: 2, err: refusedErr}})
	if w.holding() {
		t.Fatal("worker 0 still holds a load after both answers")
	}
	if w.cfgGen != s.cfgGen && w.refused != s.cfgGen && !s.reloading && s.retryTimer == nil {
		t.Fatalf("worker 0 runs gen %d, the fleet gen %d, it has not refused it (refused %d), and no catch-up is under way or armed: it stays behind", w.cfgGen, s.cfgGen, w.refused)
	}
}
