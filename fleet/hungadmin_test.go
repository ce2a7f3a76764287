package fleet

import (
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
)

// heldLoads is a gate for an adminScript's held loads, released by release
// or when the test ends.
func heldLoads(t *testing.T) (hold <-chan struct{}, release func()) {
	ch := make(chan struct{})
	var released atomic.Bool
	release = func() {
		if released.CompareAndSwap(false, true) {
			close(ch)
		}
	}
	t.Cleanup(release)
	return ch, release
}

// TestHungWorkerGetsNoMoreLoads: a worker whose admin endpoint holds a load
// past the load timeout counts as refusing it, and the refusing are asked
// again, over and over. Caddy applies loads one at a time, so each retry
// into a worker that never answered would queue behind the one it holds,
// to be applied, stale, whenever it lets go. The retries leave it alone
// until it answers; its late answer is taken in as before, and a worker
// that is then behind the fleet is caught up.
func TestHungWorkerGetsNoMoreLoads(t *testing.T) {
	hold, release := heldLoads(t)
	// Worker 0 holds its first load; worker 1 takes it, so that it
	// becomes the fleet's; worker 2 refuses its first, so that retries
	// come while worker 0 holds.
	l := newAdv9Loop(t, adminScript{holdFrom: 1, hold: hold}, adminScript{}, adminScript{refuse: 1})
	s, admin := l.s, l.admin
	s.loadTimeout = 100 * time.Millisecond
	s.retryMin = 50 * time.Millisecond
	for _, w := range s.workers {
		w.ready = true
	}
	l.start()
	defer l.stop(t)
	adv18Reload(t, l, "2")
	adv11Want(t, admin[0], "worker 0", "2")
	adv11Want(t, admin[1], "worker 1", "2")
	adv11Want(t, admin[2], "worker 2", "2")
	// Worker 0 times out at 100ms, and holds on; worker 2 is retried 50ms
	// later, and accepts.
	adv11Want(t, admin[2], "worker 2, retried", "2")
	deadline := time.After(time.Second)
	for more := true; more; {
		select {
		case b := <-admin[0]:
			t.Fatalf("worker 0 got another load (%s) while it held one it had not answered", b)
		case <-deadline:
			more = false
		}
	}
	// Once it answers (it applied v=2 late), it runs the fleet's
	// configuration: nothing more to send it.
	release()
	if b, ok := adv9Loaded(admin[0], 500*time.Millisecond); ok && !strings.Contains(string(b), `"v":"2"`) {
		t.Fatalf("worker 0 got %s after its late answer; want nothing, or v=2", b)
	}
}

// TestLateAnswerBeforeOutcome: a load that timed out answers late, and the
// answer may reach the supervisor before its reload's outcome does (the
// outcome waits for the slowest worker). In either order the worker ends
// holding no load, so later catch-ups reach it.
func TestLateAnswerBeforeOutcome(t *testing.T) {
	timedOut := fmt.Errorf("%w: test", errLoadTimeout)
	for _, answerFirst := range []bool{false, true} {
		s := &supervisor{config: []byte(`{"v":2}`), cfgGen: 2, genSeq: 2, events: make(chan event, 8), log: zap.NewNop(), sockets: &fleetSockets{}, retryMin: time.Hour}
		w := &worker{id: 0, gen: 1, cfgGen: 1, running: true, ready: true, loads: 1}
		s.workers = []*worker{w}
		load := loadResult{id: 0, gen: 1, seq: 1, cfgGen: 2}
		outcome := func() {
			l := load
			l.err = timedOut
			s.reloaded(event{kind: evReloaded, config: s.config, gen: 2, loads: []loadResult{l}})
		}
		answer := func() {
			l := load
			l.err = errors.New("refused by the test")
			s.lateLoaded(event{kind: evLateLoad, config: s.config, late: l})
		}
		if answerFirst {
			answer()
			outcome()
		} else {
			outcome()
			if !w.holding() {
				t.Fatal("after the timeout: the worker does not count as holding the load")
			}
			answer()
		}
		if w.holding() || len(w.late) != 0 {
			t.Errorf("answer first %v: holding %v, %d loads recorded after both events; want false, 0", answerFirst, w.holding(), len(w.late))
		}
		if w.refused != 2 {
			t.Errorf("answer first %v: worker refused %d, want 2 (retried later)", answerFirst, w.refused)
		}
		if s.retryTimer != nil {
			s.retryTimer.Stop()
		}
	}
}
