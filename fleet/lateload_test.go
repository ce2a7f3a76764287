package fleet

import (
	"bytes"
	"errors"
	"testing"
	"time"

	_ "github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
)

// TestLateLoadBecomesFleetConfig: a reload whose load answers after its
// timeout counts as refused, and with every worker late the fleet keeps
// its previous configuration. The worker applies the new one all the same,
// so once it answers, the new configuration must become the fleet's:
// otherwise a worker restarted later runs a configuration that no other
// worker runs and that the operator replaced. The worker is Caddy itself,
// in this process, with its admin endpoint on a unix socket; it runs a
// shutdown_delay the fleet's configuration does not state (a worker behind
// the fleet), so its load outlasts the timeout.
func TestLateLoadBecomesFleetConfig(t *testing.T) {
	sock := adminSockPath(t)
	cfg := serverConfig
	s := &supervisor{
		config:      cfg("127.0.0.1:0", "0s"),
		cfgGen:      1,
		genSeq:      1,
		events:      make(chan event, 4),
		log:         zap.NewNop(),
		loadTimeout: 100 * time.Millisecond,
		sockets:     &fleetSockets{},
	}
	w := &worker{id: 0, gen: 1, sock: sock, cfgGen: 1, running: true, ready: true}
	s.workers = []*worker{w}
	runCaddyHere(t, cfg("127.0.0.1:0", "700ms"), sock)

	next := cfg("127.0.0.2:0", "0s") // the old listener closes: the load sleeps 700ms
	s.genSeq++
	s.push(next, s.genSeq, s.workers)
	recv := func(what string) event {
		t.Helper()
		select {
		case ev := <-s.events:
			return ev
		case <-time.After(10 * time.Second):
			t.Fatalf("no %s within 10s", what)
			return event{}
		}
	}
	ev := recv("outcome of the reload")
	if ev.kind != evReloaded || len(ev.loads) != 1 || !errors.Is(ev.loads[0].err, errLoadTimeout) {
		t.Fatalf("event %+v; want the reload's outcome, its load timed out", ev)
	}
	s.reloading = false
	s.reloaded(ev)
	if s.cfgGen != 1 {
		t.Fatalf("fleet configuration %d after a reload every worker answered too late; want 1, the previous one", s.cfgGen)
	}

	ev = recv("late answer from the worker, which applied the configuration")
	if ev.kind != evLateLoad {
		t.Fatalf("event %+v; want the worker's late answer", ev)
	}
	s.lateLoaded(ev)
	if s.cfgGen != 2 || !bytes.Equal(s.config, next) {
		t.Errorf("fleet configuration %d (%s) after the worker applied the reload late; want 2 (%s): workers would restart with one none runs", s.cfgGen, s.config, next)
	}
	if w.cfgGen != 2 || w.refused != 0 {
		t.Errorf("worker at configuration %d, refused %d; want 2, 0", w.cfgGen, w.refused)
	}
}

// TestLateLoadOrder: a late answer counts when the load was applied, by
// the process it was sent to, and sent after any the worker applied; it
// changes the fleet's configuration only when newer, and a worker it leaves
// behind the fleet is caught up.
func TestLateLoadOrder(t *testing.T) {
	late := []byte(`{"late":true}`)
	for _, tc := range []struct {
		name string
		// before: the fleet's and the worker's configuration, the number
		// of the load the worker last applied, and the configuration it
		// last refused
		fleet, worker, applied, refused int
		// the answer: the worker's process, the load's number and its
		// configuration
		procGen, seq, gen int
		err               error
		// after, and whether a catch-up was sent
		wantFleet, wantWorker, wantRefused int
		wantCatchUp                        bool
	}{
		{"newer, applied", 3, 3, 1, 5, 1, 2, 5, nil, 5, 5, 0, false},
		{"newer, refused", 3, 3, 1, 5, 1, 2, 5, errors.New("bad config"), 3, 3, 5, false},
		{"from a process since restarted", 3, 3, 1, 5, 0, 2, 5, nil, 3, 3, 5, false},
		{"sent before one the worker applied", 4, 4, 3, 0, 1, 2, 3, nil, 4, 4, 0, false},
		{"the fleet's own, asked again", 4, 3, 1, 4, 1, 2, 4, nil, 4, 4, 0, false},
		{"older, sent after a newer one", 5, 5, 2, 0, 1, 3, 4, nil, 5, 4, 0, true},
		{"the fleet's, answered after a load sent later", 3, 2, 3, 3, 1, 2, 3, nil, 3, 2, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fleetCfg := []byte(`{"fleet":true}`)
			s := &supervisor{config: fleetCfg, cfgGen: tc.fleet, genSeq: 5, events: make(chan event, 4), log: zap.NewNop(), sockets: &fleetSockets{}}
			w := &worker{id: 0, gen: 1, cfgGen: tc.worker, applied: tc.applied, loads: max(tc.applied, tc.seq), refused: tc.refused, running: true, ready: true, sock: "/nonexistent/admin.sock"}
			s.workers = []*worker{w}
			s.lateLoaded(event{kind: evLateLoad, config: late, late: loadResult{id: 0, gen: tc.procGen, seq: tc.seq, cfgGen: tc.gen, err: tc.err}})
			if s.cfgGen != tc.wantFleet || w.cfgGen != tc.wantWorker || w.refused != tc.wantRefused {
				t.Errorf("fleet %d, worker %d, refused %d; want %d, %d, %d", s.cfgGen, w.cfgGen, w.refused, tc.wantFleet, tc.wantWorker, tc.wantRefused)
			}
			want := fleetCfg
			if tc.wantFleet != tc.fleet {
				want = late
			}
			if !bytes.Equal(s.config, want) {
				t.Errorf("fleet configuration %s; want %s", s.config, want)
			}
			if s.reloading != tc.wantCatchUp {
				t.Errorf("catch-up sent: %v; want %v", s.reloading, tc.wantCatchUp)
			}
		})
	}
}

// TestLateLoadRetriesTheRefusing: once a late answer makes a configuration
// the fleet's, the workers that refused it (or whose loads timed out too)
// are asked again, as after a reload some workers refused.
func TestLateLoadRetriesTheRefusing(t *testing.T) {
	s := &supervisor{config: []byte(`{}`), cfgGen: 3, genSeq: 5, events: make(chan event, 4), log: zap.NewNop(), sockets: &fleetSockets{}, retryMin: time.Millisecond}
	late := &worker{id: 0, gen: 1, cfgGen: 3, refused: 5, running: true, ready: true}
	other := &worker{id: 1, gen: 1, cfgGen: 3, refused: 5, running: true, ready: true}
	s.workers = []*worker{late, other}
	s.lateLoaded(event{kind: evLateLoad, config: []byte(`{"late":true}`), late: loadResult{id: 0, gen: 1, seq: 1, cfgGen: 5}})
	if s.cfgGen != 5 {
		t.Fatalf("fleet configuration %d after the late answer; want 5", s.cfgGen)
	}
	select {
	case ev := <-s.events:
		if ev.kind != evRetryRefused {
			t.Fatalf("event %+v; want a retry of the worker that refused", ev)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("worker 1 refused the configuration the fleet now runs, and no retry came within 5s")
	}
}
