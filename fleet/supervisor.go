package fleet

import (
	"bytes"
	"cmp"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/caddyserver/caddy/v2"
	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/orbitproxy/orbit/internal/privdir"
)

// Restart delays of a worker that keeps exiting: doubling from the first to
// the last; a worker that ran for stableRun starts again from the first.
const (
	restartDelayMin = 100 * time.Millisecond
	restartDelayMax = 10 * time.Second
	stableRun       = 30 * time.Second

	// workerShutdownDelay is how long a worker's old servers keep serving
	// what they accepted before shutting down, on a reload or a stop, when
	// the configuration sets no shutdown_delay.
	workerShutdownDelay = time.Second
	// workerLoadTimeout bounds a configuration load into a worker: a
	// worker whose admin endpoint hangs counts as refusing it (and is asked
	// again, see retryRefused) instead of holding every later reload back.
	// Loading a configuration provisions its modules, which may take a
	// while; a minute is far beyond any healthy load. Caddy answers a load
	// only once the old configuration has stopped, which sleeps through
	// its shutdown_delay when a listener closes: that comes on top (see
	// loadTimeoutFor).
	workerLoadTimeout = time.Minute
)

// supervisor runs the workers of `caddy orbit-fleet`. One goroutine, run's
// event loop, owns all of its state; process exits, pingbacks, timers and
// signals reach it as events.
type supervisor struct {
	exe          string
	configFile   string
	adapter      string
	n            int
	runDir       string
	stopTimeout  time.Duration
	startTimeout time.Duration
	handover     bool // start beside another process listening on the same addresses
	pidfile      string
	log          *zap.Logger

	ln      net.Listener  // pingbacks: a worker echoes its token once its config runs
	sockets *fleetSockets // listening sockets shared by the workers
	events  chan event
	done    chan struct{} // closed when the event loop returns
	spawn   chan spawnRequest
	workers []*worker
	// config is the adapted configuration the fleet runs, before
	// per-worker changes: the last one a worker accepted on a reload (or
	// the first). A worker (re)starts with it. cfgGen numbers it, and
	// genSeq numbers every configuration a reload tries.
	config    []byte
	cfgGen    int
	genSeq    int
	stopping  bool
	reloading bool
	reloadDue bool
	// retryDelay is how long after a partly refused reload the workers
	// that refused the fleet's configuration are asked again (see
	// retryRefused); it doubles from retryMin (0: retryRefusedMin) while
	// they keep refusing. retryTimer is the retry scheduled, if any.
	retryDelay time.Duration
	retryMin   time.Duration
	retryTimer *time.Timer
	// pidTimer is the next sweepPidFiles, if any; pidSweep is its
	// interval (0: pidSweepEvery).
	pidTimer *time.Timer
	pidSweep time.Duration
	// loadTimeout bounds each load into a worker (0: workerLoadTimeout).
	loadTimeout time.Duration
}

// Bounds of retryDelay. The workers run one binary with one configuration,
// so a worker that refuses what its siblings accepted most often failed
// for a passing reason of its own.
const (
	retryRefusedMin = time.Second
	retryRefusedMax = 30 * time.Second
)

type worker struct {
	id      int
	sock    string // admin endpoint, a unix socket
	cfgPath string
	pidPath string

	gen     int // incremented on each start
	token   string
	proc    *os.Process
	started time.Time
	running bool
	ready   bool
	delay   time.Duration
	timer   *time.Timer
	// cfgGen is the configuration this worker runs, or the one it was
	// started with until it is ready; refused, the last one it refused
	// to load.
	cfgGen  int
	refused int
	// loads numbers the loads sent to this process, and applied is the
	// number of the last one it applied, which cfgGen is. A process
	// applies loads one at a time, in the order they were sent (Caddy
	// holds a lock through each), but answers to loads that timed out
	// reach the supervisor in any order, and a load the supervisor sends
	// (a catch-up of the fleet's configuration) may be older than one the
	// process has yet to apply: the order of sending, not the
	// configurations' generations, says which the process runs.
	loads, applied int
	// late holds, by number, the loads that timed out and whose reload's
	// outcome or late answer, not both, has come in: true for a timeout
	// not answered yet. Caddy applies loads one at a time, so a load sent
	// while the worker holds one would queue behind it, to be applied
	// whenever the worker lets go: retries and catch-ups leave the worker
	// alone until it answers (see holding).
	late map[int]bool
}

// lateEvent records one of the two events of a load, number seq, that timed
// out: its timeout, in its reload's outcome, or its late answer. Either may
// come first, for a reload's outcome waits for its slowest worker.
func (w *worker) lateEvent(seq int, timeout bool) {
	if _, ok := w.late[seq]; ok {
		delete(w.late, seq) // the other one came first
		return
	}
	if w.late == nil {
		w.late = make(map[int]bool)
	}
	w.late[seq] = timeout
}

// holding reports whether w holds a load that timed out.
func (w *worker) holding() bool {
	for _, timeout := range w.late {
		if timeout {
			return true
		}
	}
	return false
}

type eventKind int

const (
	evExited eventKind = iota
	evReady
	evRestart
	evReloaded
	evSignal
	evStartTimeout
	evStopTimeout
	evRetryRefused
	evLateLoad
	evSweepPids
)

type event struct {
	kind  eventKind
	id    int
	gen   int
	err   error
	token string
	sig   os.Signal
	// A reload's outcome (evReloaded): the configuration it loaded, its
	// generation, and what each worker answered.
	config []byte
	loads  []loadResult
	// A late answer (evLateLoad): the configuration in config, and the
	// answer in late.
	late loadResult
}

// loadResult is a worker's answer to a configuration load: id is its slot,
// gen its process generation, seq the load's number among those sent to
// that process (see worker.loads), and cfgGen the configuration's
// generation.
type loadResult struct {
	id, gen, seq, cfgGen int
	err                  error
}

type spawnRequest struct {
	w     *worker
	reply chan error
}

func (s *supervisor) run() error {
	if err := privdir.Ensure(s.runDir); err != nil {
		return fmt.Errorf("run directory: %w", err)
	}
	lock, err := lockRunDir(s.runDir)
	if err != nil {
		return err
	}
	defer lock.Close()

	if s.config, err = s.adapt(); err != nil {
		return err
	}
	s.cfgGen, s.genSeq = 1, 1
	s.sockets, err = openFleetSockets(s.config, s.n, s.handover)
	if err != nil {
		return err
	}
	defer s.sockets.close()
	if len(s.sockets.unclaimed) > 0 {
		s.log.Warn("opened addresses without the lock that keeps two fleets from opening one address at once: something held it too long",
			zap.Strings("addresses", s.sockets.unclaimed))
	}
	// Only now, with the run directory and the addresses this fleet's:
	// a fleet refused for either must not replace the pid file of the one
	// that holds them.
	if s.pidfile != "" {
		pid := []byte(strconv.Itoa(os.Getpid()) + "\n")
		if err := os.WriteFile(s.pidfile, pid, 0o644); err != nil {
			return fmt.Errorf("writing pidfile: %w", err)
		}
		defer func() {
			// A fleet that took over (--handover) may have written its
			// own pid there since.
			if b, err := os.ReadFile(s.pidfile); err == nil && bytes.Equal(b, pid) {
				os.Remove(s.pidfile)
			}
		}()
	}
	if len(s.sockets.taken) > 0 {
		s.log.Warn("starting beside other processes listening on the same addresses (--handover): clients go to both until they stop",
			zap.Strings("addresses", s.sockets.taken))
	}
	adm, err := newAdminSockets(s.runDir)
	if err != nil {
		return err
	}
	adm.removeStale()
	// Again while workers of a killed fleet, still draining now, remain
	// (they may exit while this run goes on, and their pid files would
	// outlive them), and once this run's workers have stopped, with the
	// run directory still locked.
	draining := removeStalePidFiles(s.runDir, nil)
	defer removeStalePidFiles(s.runDir, nil)
	// After every unpoint: a link of an earlier run whose worker exited
	// while this run went on leads nowhere by then.
	defer adm.removeDangling()
	for i := range s.n {
		w := &worker{
			id:      i,
			sock:    adm.path(i),
			cfgPath: filepath.Join(s.runDir, fmt.Sprintf("worker-%d.json", i)),
			pidPath: filepath.Join(s.runDir, fmt.Sprintf("worker-%d.pid", i)),
		}
		if len(w.sock) > maxSocketPath {
			return fmt.Errorf("run directory %s is too long for a unix socket path; choose a shorter --run-dir", s.runDir)
		}
		if err := adm.point(i); err != nil {
			return err
		}
		defer adm.unpoint(i)
		s.workers = append(s.workers, w)
	}
	// Refuse what no worker could run (admin off) before starting any; each
	// worker's file is written as it starts.
	if _, err := workerConfig(s.config, "", nil); err != nil {
		return err
	}

	s.ln, err = net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("listening for worker pingbacks: %w", err)
	}
	defer s.ln.Close()
	s.events = make(chan event, 4*s.n+16)
	s.done = make(chan struct{})
	if draining > 0 {
		s.armPidSweep()
	}
	go s.acceptPingbacks()

	// Children are started from one locked OS thread that lives as long as
	// the fleet: Pdeathsig fires when the thread that forked a child exits,
	// not when the process does.
	s.spawn = make(chan spawnRequest)
	spawnerDone := make(chan struct{})
	go s.spawner(spawnerDone)
	defer func() {
		close(s.spawn)
		<-spawnerDone
	}()

	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGHUP, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	go func() {
		for sig := range sigs {
			s.events <- event{kind: evSignal, sig: sig}
		}
	}()

	keys := make([]string, 0, len(s.sockets.fds))
	for k := range s.sockets.fds {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	s.log.Info("starting fleet",
		zap.Int("workers", s.n),
		zap.Strings("shared_sockets", keys),
		zap.String("config", s.configFile),
		zap.String("run_dir", s.runDir))
	var startErr error
	for _, w := range s.workers {
		if startErr = s.start(w); startErr != nil {
			s.log.Error("fleet failed to start", zap.Error(startErr))
			s.stopAll()
			break
		}
	}
	err = s.loop(startErr)
	close(s.done)
	return err
}

// loop handles events until every worker has stopped. startErr is a failure
// to start the fleet, already being stopped.
func (s *supervisor) loop(startErr error) error {
	starting := true
	startTimer := time.AfterFunc(s.startTimeout, func() { s.events <- event{kind: evStartTimeout} })
	defer startTimer.Stop()
	var stopTimer *time.Timer
	if s.stopping {
		stopTimer = s.armStopTimer()
	}
	defer func() {
		if stopTimer != nil {
			stopTimer.Stop()
		}
		if s.retryTimer != nil {
			s.retryTimer.Stop()
		}
		if s.pidTimer != nil {
			s.pidTimer.Stop()
		}
	}()
	for {
		if s.stopping && s.runningCount() == 0 {
			for _, w := range s.workers {
				os.Remove(w.pidPath)
			}
			s.log.Info("fleet stopped")
			return startErr
		}
		ev := <-s.events
		switch ev.kind {
		case evReady:
			for _, w := range s.workers {
				if w.running && !w.ready && w.token == ev.token {
					w.ready = true
					s.log.Info("worker ready", zap.Int("worker", w.id), zap.Int("pid", w.proc.Pid), zap.String("admin", "unix/"+w.sock))
				}
			}
			if !s.reloading && !s.stopping {
				s.catchUp()
			}
			if starting && s.readyCount() == s.n {
				starting = false
				startTimer.Stop()
				s.log.Info("fleet ready", zap.Int("workers", s.n))
			}

		case evExited:
			w := s.workers[ev.id]
			if ev.gen != w.gen || !w.running {
				break
			}
			w.running = false
			wasReady := w.ready
			w.ready = false
			os.Remove(w.pidPath)
			if s.stopping {
				s.log.Info("worker stopped", zap.Int("worker", w.id), zap.String("status", exitStatus(ev.err)))
				break
			}
			if starting && !wasReady {
				startErr = fmt.Errorf("worker %d exited before its configuration ran (%s); see its log above", w.id, exitStatus(ev.err))
				s.log.Error("worker failed to start", zap.Int("worker", w.id), zap.String("status", exitStatus(ev.err)))
				s.stopAll()
				stopTimer = s.armStopTimer()
				break
			}
			if time.Since(w.started) >= stableRun || w.delay == 0 {
				w.delay = restartDelayMin
			} else {
				w.delay = min(2*w.delay, restartDelayMax)
			}
			s.log.Warn("worker exited; restarting it",
				zap.Int("worker", w.id),
				zap.String("status", exitStatus(ev.err)),
				zap.Duration("delay", w.delay))
			id, gen := w.id, w.gen
			w.timer = time.AfterFunc(w.delay, func() { s.events <- event{kind: evRestart, id: id, gen: gen} })

		case evRestart:
			w := s.workers[ev.id]
			if s.stopping || w.running || ev.gen != w.gen {
				break
			}
			if err := s.start(w); err != nil {
				s.log.Error("restarting worker", zap.Int("worker", w.id), zap.Error(err))
				id, gen := w.id, w.gen
				w.delay = min(2*max(w.delay, restartDelayMin), restartDelayMax)
				w.timer = time.AfterFunc(w.delay, func() { s.events <- event{kind: evRestart, id: id, gen: gen} })
			}

		case evReloaded:
			s.reloading = false
			if s.stopping {
				break
			}
			s.reloaded(ev)
			if s.reloadDue {
				s.reloadDue = false
				s.reload()
			}
			if !s.reloading {
				s.catchUp()
			}

		case evLateLoad:
			if !s.stopping {
				s.lateLoaded(ev)
			}

		case evSweepPids:
			s.sweepPidFiles()

		case evRetryRefused:
			s.retryTimer = nil
			if s.stopping {
				break
			}
			s.retryRefused()

		case evStartTimeout:
			if starting && !s.stopping {
				startErr = fmt.Errorf("%d of %d workers did not load their configuration within %s", s.n-s.readyCount(), s.n, s.startTimeout)
				s.log.Error("fleet failed to start", zap.Error(startErr))
				s.stopAll()
				stopTimer = s.armStopTimer()
			}

		case evStopTimeout:
			s.killAll()

		case evSignal:
			switch ev.sig {
			case syscall.SIGHUP:
				if s.stopping {
					break
				}
				if s.reloading {
					s.reloadDue = true
					break
				}
				s.reload()
			default:
				if s.stopping {
					s.log.Warn("second stop signal: killing workers", zap.Stringer("signal", ev.sig))
					s.killAll()
					break
				}
				s.log.Info("stopping fleet", zap.Stringer("signal", ev.sig))
				s.stopAll()
				stopTimer = s.armStopTimer()
			}
		}
	}
}

func (s *supervisor) armStopTimer() *time.Timer {
	return time.AfterFunc(s.stopTimeout, func() { s.events <- event{kind: evStopTimeout} })
}

func (s *supervisor) runningCount() int {
	n := 0
	for _, w := range s.workers {
		if w.running {
			n++
		}
	}
	return n
}

func (s *supervisor) readyCount() int {
	n := 0
	for _, w := range s.workers {
		if w.ready {
			n++
		}
	}
	return n
}

// start starts worker w with a fresh token.
func (s *supervisor) start(w *worker) error {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return fmt.Errorf("making a pingback token: %w", err)
	}
	// The worker runs the fleet's configuration, whatever a reload since
	// its last start tried.
	body, err := workerConfig(s.config, w.sock, s.sockets)
	if err == nil {
		err = privdir.WriteFile(w.cfgPath, body)
	}
	if err != nil {
		return fmt.Errorf("writing worker %d configuration: %w", w.id, err)
	}
	w.gen++
	w.cfgGen = s.cfgGen
	w.refused = 0
	w.loads, w.applied, w.late = 0, 0, nil
	w.token = hex.EncodeToString(b[:])
	reply := make(chan error, 1)
	s.spawn <- spawnRequest{w: w, reply: reply}
	if err := <-reply; err != nil {
		return fmt.Errorf("starting worker %d: %w", w.id, err)
	}
	w.running = true
	w.ready = false
	w.started = time.Now()
	if err := privdir.WriteFile(w.pidPath, []byte(strconv.Itoa(w.proc.Pid)+"\n")); err != nil {
		s.log.Warn("writing worker pid file", zap.Int("worker", w.id), zap.Error(err))
	}
	s.log.Info("worker started", zap.Int("worker", w.id), zap.Int("pid", w.proc.Pid))
	return nil
}

// spawner forks the workers from its own OS thread.
func (s *supervisor) spawner(done chan<- struct{}) {
	runtime.LockOSThread()
	defer close(done)
	for req := range s.spawn {
		req.reply <- s.fork(req.w)
	}
	// Keep the thread locked: it exits with this goroutine, which is fine
	// now that every worker has exited.
}

func (s *supervisor) fork(w *worker) error {
	cmd := exec.Command(s.exe, "run", "--config", w.cfgPath, "--pingback", s.ln.Addr().String())
	cmd.Stdin = strings.NewReader(w.token)
	cmd.Stdout = os.Stdout
	cmd.Stderr = os.Stderr
	cmd.Env = append(os.Environ(),
		"ORBIT_FLEET_WORKER="+strconv.Itoa(w.id),
		"ORBIT_FLEET_WORKERS="+strconv.Itoa(s.n),
		idEnv+"="+s.runDir+":"+strconv.Itoa(os.Getpid()),
		s.sockets.env())
	cmd.ExtraFiles = s.sockets.files[w.id]
	cmd.SysProcAttr = &syscall.SysProcAttr{
		// Its own process group: a terminal's Ctrl-C reaches the
		// supervisor, which stops the workers once, gracefully.
		Setpgid: true,
		// A supervisor that dies without stopping its workers takes them
		// with it rather than leaving an unsupervised fleet.
		Pdeathsig: syscall.SIGTERM,
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	w.proc = cmd.Process
	id, gen := w.id, w.gen
	go func() {
		err := cmd.Wait()
		s.events <- event{kind: evExited, id: id, gen: gen, err: err}
	}()
	return nil
}

// acceptPingbacks turns each worker's echoed token into a ready event.
func (s *supervisor) acceptPingbacks() {
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			b, err := io.ReadAll(io.LimitReader(c, 64))
			if err != nil {
				return
			}
			s.events <- event{kind: evReady, token: string(b)}
		}()
	}
}

// stopAll asks every running worker to stop gracefully, and lets go of the
// listening sockets: once the workers' servers have closed theirs, new
// connections are refused, as by one server that stops, instead of queueing
// where no worker will accept them again (to be reset when the fleet exits).
func (s *supervisor) stopAll() {
	s.stopping = true
	s.sockets.close()
	for _, w := range s.workers {
		if w.timer != nil {
			w.timer.Stop()
		}
		if w.running {
			if err := w.proc.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
				s.log.Warn("signalling worker", zap.Int("worker", w.id), zap.Error(err))
			}
		}
	}
}

// killAll kills every worker still running.
func (s *supervisor) killAll() {
	for _, w := range s.workers {
		if w.running {
			s.log.Warn("killing worker", zap.Int("worker", w.id), zap.Int("pid", w.proc.Pid))
			w.proc.Kill()
		}
	}
}

// reload adapts the configuration file again and loads it into every ready
// worker. It becomes the fleet's configuration, the one workers restart
// with, only if a worker accepted it (or none was ready to try it): a
// configuration every worker refused leaves the fleet as it was, as `caddy
// reload` leaves a lone Caddy. A worker still starting gets it once ready.
func (s *supervisor) reload() {
	s.log.Info("reloading configuration", zap.String("config", s.configFile))
	cfg, err := s.adapt()
	if err == nil {
		// Refuse what no worker could run (admin off) before trying it.
		_, err = workerConfig(cfg, "", nil)
	}
	if err != nil {
		s.log.Error("reload failed: keeping the running configuration", zap.Error(err))
		return
	}
	var targets []*worker
	for _, w := range s.workers {
		if w.running && w.ready {
			targets = append(targets, w)
		}
	}
	s.genSeq++
	s.push(cfg, s.genSeq, targets)
}

// catchUp loads the fleet's configuration into the ready workers that were
// started with an older one (they started while a reload was under way),
// unless they already refused it or still hold a load (see worker.late).
func (s *supervisor) catchUp() {
	var targets []*worker
	var ids []int
	for _, w := range s.workers {
		if w.running && w.ready && w.cfgGen != s.cfgGen && w.refused != s.cfgGen && !w.holding() {
			targets = append(targets, w)
			ids = append(ids, w.id)
		}
	}
	if len(targets) == 0 {
		return
	}
	s.log.Info("loading the current configuration into workers that started with an older one", zap.Ints("workers", ids))
	s.push(s.config, s.cfgGen, targets)
}

// push loads cfg, generation gen, into the targets, all at once (each
// worker hands its sockets from its old servers to its new ones, so none
// stops serving meanwhile); an evReloaded event reports the outcome.
func (s *supervisor) push(cfg []byte, gen int, targets []*worker) {
	type target struct {
		load loadResult
		sock string
		body []byte
	}
	var ts []target
	for _, w := range targets {
		body, err := workerConfig(cfg, w.sock, s.sockets)
		if err != nil {
			s.log.Error("reload failed: keeping the running configuration", zap.Error(err))
			return
		}
		w.loads++ // a later target's error leaves this number unused: only the order counts
		ts = append(ts, target{loadResult{id: w.id, gen: w.gen, seq: w.loads, cfgGen: gen}, w.sock, body})
	}
	s.reloading = true
	timeout := s.loadTimeoutFor(cfg)
	go func() {
		loads := make([]loadResult, len(ts))
		var wg sync.WaitGroup
		for i, t := range ts {
			wg.Go(func() {
				late := func(err error) {
					l := t.load
					l.err = err
					s.send(event{kind: evLateLoad, config: cfg, late: l})
				}
				err := loadInto(t.sock, t.body, timeout, late)
				if err != nil {
					msg := "reloading worker: it keeps running its previous configuration"
					if errors.Is(err, errLoadTimeout) {
						msg = "reloading worker: no answer in time; counted as a refusal until it answers"
					}
					s.log.Error(msg, zap.Int("worker", t.load.id), zap.Error(err))
				} else {
					s.log.Info("worker reloaded", zap.Int("worker", t.load.id))
				}
				loads[i] = t.load
				loads[i].err = err
			})
		}
		wg.Wait()
		s.events <- event{kind: evReloaded, config: cfg, gen: gen, loads: loads}
	}()
}

// reloaded takes in a reload's outcome: a new configuration a worker
// accepted becomes the fleet's.
func (s *supervisor) reloaded(ev event) {
	accepted := 0
	for _, l := range ev.loads {
		if l.err == nil {
			accepted++
		}
	}
	switch {
	case ev.gen <= s.cfgGen:
		// A catch-up, to the fleet's own configuration, or to one a late
		// answer (lateLoaded) made the fleet replace while it was under
		// way: never the fleet's again.
	case accepted == 0 && len(ev.loads) > 0:
		s.log.Error("reload failed: every worker refused the new configuration; the fleet keeps running the previous one, and restarts workers with it")
	default:
		s.adopt(ev.config, ev.gen)
		if accepted < len(ev.loads) {
			s.log.Error("reload partly failed: the workers that refused the new configuration keep running the previous one until they accept it (they are asked again), restart, or the next reload")
		}
	}
	refused := false
	for _, l := range ev.loads {
		w := s.workers[l.id]
		if l.gen != w.gen {
			continue // restarted meanwhile, with the fleet's configuration
		}
		if errors.Is(l.err, errLoadTimeout) {
			w.lateEvent(l.seq, true)
		}
		switch {
		case l.err == nil:
			w.took(l)
		case w.cfgGen == ev.gen:
			// Its late answer came first: it applied this load, and
			// runs the configuration (see lateLoaded).
		default:
			w.refused = ev.gen
			refused = refused || ev.gen == s.cfgGen
		}
	}
	switch {
	case refused && s.retryTimer == nil:
		s.retryLater()
	case !refused && ev.gen == s.cfgGen:
		s.retryDelay = 0
	}
}

// adopt makes cfg, generation gen, the fleet's configuration, which a
// worker runs.
func (s *supervisor) adopt(cfg []byte, gen int) {
	s.config, s.cfgGen = cfg, gen
	s.retryDelay = 0 // refusals of a new configuration start at retryMin again
	if dropped := s.sockets.dropUnused(s.config); len(dropped) > 0 {
		s.log.Info("the configuration no longer listens on these addresses: closed the fleet's sockets for them", zap.Strings("addresses", dropped))
	}
}

// lateLoaded takes in a worker's answer to a load that had timed out, and
// so counted as refused (see loadInto). A worker that applied it runs that
// configuration, unless it has applied a load sent later: if it is newer
// than the fleet's, it becomes the fleet's, as if the worker had answered in
// time, and the other workers are brought to it. Otherwise a reload every
// worker answered too late would leave the fleet restarting workers with a
// configuration none of them runs. A worker left behind the fleet (it
// applied a catch-up sent behind a newer load, or its newest load's answer
// came first) is caught up.
func (s *supervisor) lateLoaded(ev event) {
	l := ev.late
	w := s.workers[l.id]
	if l.gen != w.gen || !w.running {
		return // restarted meanwhile, with the fleet's configuration
	}
	w.lateEvent(l.seq, false)
	if l.err != nil {
		s.log.Warn("worker answered a load that had timed out: it refused the configuration", zap.Int("worker", w.id), zap.Error(l.err))
		if l.cfgGen == s.cfgGen {
			// Retries passed it over while it held the load.
			w.refused = s.cfgGen
		}
	} else {
		s.log.Info("worker applied a configuration after its load had timed out", zap.Int("worker", w.id))
		if w.refused == l.cfgGen {
			w.refused = 0 // counted as refused when it timed out
		}
		if w.took(l) && l.cfgGen > s.cfgGen {
			s.log.Warn("a worker applied a reload's configuration after its load had timed out: it is the fleet's configuration now, and the other workers are loaded with it", zap.Int("worker", w.id))
			s.adopt(ev.config, l.cfgGen)
		}
		if !s.reloading {
			s.catchUp()
		}
	}
	refused := func(o *worker) bool { return o.running && o.refused == s.cfgGen }
	if s.retryTimer == nil && slices.ContainsFunc(s.workers, refused) {
		s.retryLater()
	}
}

// took records that w applied load l, unless it has applied one sent after
// l since (see worker.loads), and reports whether l is what w runs now.
func (w *worker) took(l loadResult) bool {
	if l.seq <= w.applied {
		return false
	}
	w.applied, w.cfgGen = l.seq, l.cfgGen
	return true
}

// send hands ev to the event loop, unless the loop has returned.
func (s *supervisor) send(ev event) {
	select {
	case s.events <- ev:
	case <-s.done:
	}
}

// retryLater asks the workers that refused the configuration the fleet runs
// again later, for as long as they refuse it, each time after twice the
// delay of the last time.
func (s *supervisor) retryLater() {
	s.retryDelay = min(max(2*s.retryDelay, s.retryLow()), retryRefusedMax)
	s.log.Warn("workers refused the fleet's configuration; trying them again", zap.Duration("in", s.retryDelay))
	s.armRetry(s.retryDelay)
}

// armRetry schedules retryRefused in d.
func (s *supervisor) armRetry(d time.Duration) {
	s.retryTimer = time.AfterFunc(d, func() { s.events <- event{kind: evRetryRefused} })
}

// retryLow is the first delay of a retry (see retryDelay).
func (s *supervisor) retryLow() time.Duration {
	if s.retryMin > 0 {
		return s.retryMin
	}
	return retryRefusedMin
}

// retryRefused loads the fleet's configuration again into the ready workers
// that refused it (see reloaded). While a reload is under way it waits its
// turn again: the reload may change what they are to run.
func (s *supervisor) retryRefused() {
	if s.reloading {
		// Not at once: a reload every worker accepted since the retry
		// was armed reset retryDelay to 0, and a retry re-armed with it
		// would spin the loop until this reload ends.
		s.armRetry(max(s.retryDelay, s.retryLow()))
		return
	}
	for _, w := range s.workers {
		// One that holds a load is passed over (see catchUp), and
		// still counts as refusing: its late answer arms the retry
		// again (see lateLoaded), whatever load that answers.
		if w.refused == s.cfgGen && !w.holding() {
			w.refused = 0
		}
	}
	s.catchUp()
}

// loadTimeoutFor bounds a load of cfg into a worker: workerLoadTimeout (or
// s.loadTimeout) past the shutdown_delay that the load may sleep through
// (Caddy stops the old configuration's HTTP app before it answers, and that
// app waits its shutdown_delay when a listener closes). The old
// configuration is taken to be the fleet's, or cfg's delay if longer: a
// worker behind the fleet runs one the supervisor no longer has.
func (s *supervisor) loadTimeoutFor(cfg []byte) time.Duration {
	return cmp.Or(s.loadTimeout, workerLoadTimeout) + max(shutdownDelay(cfg), shutdownDelay(s.config))
}

// shutdownDelay is the shutdown_delay of config's HTTP app as a worker runs
// it (workerShutdownDelay where it sets none, see workerConfig); 0 without
// an HTTP app, or if config does not decode, which push has reported.
func shutdownDelay(config []byte) time.Duration {
	var cfg struct {
		Apps struct {
			HTTP *struct {
				ShutdownDelay *caddy.Duration `json:"shutdown_delay"`
			} `json:"http"`
		} `json:"apps"`
	}
	if json.Unmarshal(config, &cfg) != nil || cfg.Apps.HTTP == nil {
		return 0
	}
	if cfg.Apps.HTTP.ShutdownDelay == nil {
		return workerShutdownDelay
	}
	return max(time.Duration(*cfg.Apps.HTTP.ShutdownDelay), 0)
}

// errLoadTimeout is a load into a worker that got no answer in time.
var errLoadTimeout = errors.New("load timed out")

// loadInto makes the worker at admin socket sock run config, even if it is
// unchanged (as `caddy reload --force` does), within timeout. The request
// is Caddy's own (caddycmd.AdminAPIRequest), whose client has no timeout:
// past it the request is left to finish in the background, when the worker
// answers or exits, and loadInto returns errLoadTimeout; late gets the
// answer then. (With a client of our own, which closed its connection after
// the answer, a worker that exited during the load sometimes left its admin
// socket file behind; with Caddy's client it did not.)
func loadInto(sock string, config []byte, timeout time.Duration, late func(error)) error {
	done := make(chan error, 1)
	var mu sync.Mutex
	timedOut := false
	go func() {
		hdr := make(http.Header)
		hdr.Set("Cache-Control", "must-revalidate")
		resp, err := caddycmd.AdminAPIRequest("unix/"+sock, http.MethodPost, "/load", hdr, bytes.NewReader(config))
		if err == nil {
			resp.Body.Close()
		}
		mu.Lock()
		tooLate := timedOut
		if !tooLate {
			done <- err
		}
		mu.Unlock()
		if tooLate {
			late(err)
		}
	}()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case err := <-done:
		return err
	case <-t.C:
	}
	mu.Lock()
	defer mu.Unlock()
	select {
	case err := <-done: // answered as the timer fired
		return err
	default:
		timedOut = true
		return fmt.Errorf("%w: its admin endpoint did not answer within %s", errLoadTimeout, timeout)
	}
}

// adapt reads and adapts the configuration file.
func (s *supervisor) adapt() ([]byte, error) {
	cfg, _, _, err := caddycmd.LoadConfig(s.configFile, s.adapter)
	if err != nil {
		return nil, err
	}
	if len(cfg) == 0 {
		return nil, errors.New("no configuration to run: use --config")
	}
	return cfg, nil
}

// workerConfig is config with its admin endpoint moved to the unix socket
// sock and config persistence off (workers sharing a port must not share an
// admin address, nor overwrite one another's autosaved config), and its HTTP
// servers listening on the shared sockets.
func workerConfig(config []byte, sock string, sockets *fleetSockets) ([]byte, error) {
	var cfg map[string]any
	if err := json.Unmarshal(config, &cfg); err != nil {
		return nil, fmt.Errorf("decoding configuration: %w", err)
	}
	if cfg == nil {
		cfg = make(map[string]any)
	}
	admin, _ := cfg["admin"].(map[string]any)
	if admin == nil {
		admin = make(map[string]any)
	}
	if off, _ := admin["disabled"].(bool); off {
		return nil, errors.New("the configuration turns the admin endpoint off; orbit-fleet needs it to reload workers (it moves it to a unix socket per worker)")
	}
	admin["listen"] = "unix/" + sock
	adminCfg, _ := admin["config"].(map[string]any)
	if adminCfg == nil {
		adminCfg = make(map[string]any)
	}
	adminCfg["persist"] = false
	admin["config"] = adminCfg
	cfg["admin"] = admin
	if sockets != nil {
		sockets.rewrite(cfg)
	}
	// net/http drops, unanswered, the request of a connection its server
	// accepted but had not read from when it began shutting down. A worker
	// that reloads hands its sockets to the new config's servers at once,
	// but the old ones must read what they already accepted before they
	// shut down: give them a moment, unless the configuration says.
	if apps, _ := cfg["apps"].(map[string]any); apps != nil {
		if httpApp, _ := apps["http"].(map[string]any); httpApp != nil {
			if _, set := httpApp["shutdown_delay"]; !set {
				httpApp["shutdown_delay"] = workerShutdownDelay.String()
			}
		}
	}
	return json.Marshal(cfg)
}

// lockRunDir keeps a second fleet out of the run directory for as long as
// the returned file is open.
func lockRunDir(dir string) (*os.File, error) {
	f, err := privdir.OpenFile(filepath.Join(dir, "fleet.lock"), os.O_RDWR|os.O_CREATE)
	if err != nil {
		return nil, fmt.Errorf("opening run directory lock: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("another orbit-fleet is running in %s", dir)
		}
		return nil, fmt.Errorf("locking run directory: %w", err)
	}
	return f, nil
}

func exitStatus(err error) string {
	if err == nil {
		return "exit status 0"
	}
	return err.Error()
}
