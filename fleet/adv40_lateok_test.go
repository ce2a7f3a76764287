package fleet

import (
	"fmt"
	"testing"
	"time"

	"go.uber.org/zap"
)

// TestAdv40LateAcceptBeforeOutcomeNotRefused: a load that timed out is
// answered late, and accepted, before its reload's outcome comes in (the
// outcome waits for the slowest worker). The worker runs the configuration
// then: the outcome, which still says "timed out", must not count it as
// refusing that configuration, nor arm a retry of workers that refused it
// (none did), with its warning and its doubled delay.
func TestAdv40LateAcceptBeforeOutcomeNotRefused(t *testing.T) {
	timedOut := fmt.Errorf("%w: test", errLoadTimeout)
	for _, newer := range []bool{false, true} {
		// newer: the reload's configuration (gen 2) is not the fleet's
		// yet; the late accept makes it the fleet's. Otherwise another
		// worker accepted it in time and it is the fleet's already.
		s := &supervisor{config: []byte(`{"v":1}`), cfgGen: 1, genSeq: 2, events: make(chan event, 8), log: zap.NewNop(), sockets: &fleetSockets{}, retryMin: time.Hour}
		if !newer {
			s.config, s.cfgGen = []byte(`{"v":2}`), 2
		}
		w := &worker{id: 0, gen: 1, cfgGen: 1, running: true, ready: true, loads: 1}
		s.workers = []*worker{w}
		load := loadResult{id: 0, gen: 1, seq: 1, cfgGen: 2}
		late := load
		s.lateLoaded(event{kind: evLateLoad, config: []byte(`{"v":2}`), late: late})
		out := load
		out.err = timedOut
		s.reloaded(event{kind: evReloaded, config: []byte(`{"v":2}`), gen: 2, loads: []loadResult{out}})
		if w.cfgGen != 2 || s.cfgGen != 2 {
			t.Fatalf("newer %v: worker runs gen %d, fleet %d; want 2, 2", newer, w.cfgGen, s.cfgGen)
		}
		if w.refused != 0 || s.retryTimer != nil {
			t.Errorf("newer %v: the worker that applied gen 2 (late, answer first) counts as refusing gen %d, retry armed %v (delay %s); want 0, false",
				newer, w.refused, s.retryTimer != nil, s.retryDelay)
		}
		if s.retryTimer != nil {
			s.retryTimer.Stop()
		}
	}
}
