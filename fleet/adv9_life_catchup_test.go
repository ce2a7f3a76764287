package fleet

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
)

// adminScript is how a fake worker's admin endpoint answers the loads it
// is sent: the first refuse are refused, and those from the holdFrom-th on
// (1-based; 0: none) are answered only once hold is closed.
type adminScript struct {
	refuse, holdFrom int
	hold             <-chan struct{}
}

// adv9Admin is a worker's admin endpoint, faked: each configuration posted
// to /load goes to loads, and is answered as script says.
func adv9Admin(t *testing.T, sock string, script adminScript) <-chan []byte {
	t.Helper()
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	loads := make(chan []byte, 16)
	var n atomic.Int64
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if r.Method != http.MethodPost || r.URL.Path != "/load" {
			return
		}
		i := n.Add(1)
		loads <- b
		if i <= int64(script.refuse) {
			http.Error(w, "refused by the test", http.StatusBadRequest)
			return
		}
		if script.holdFrom > 0 && i >= int64(script.holdFrom) {
			select {
			case <-script.hold:
			case <-time.After(10 * time.Second):
			}
		}
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return loads
}

// adv9Loop is a supervisor over fake workers, all running, the fleet's
// configuration (`{"apps":{"v":"1"}}`, generation 1) in the file the
// supervisor adapts: its event loop runs in the background, driven by the
// events the test sends as the spawner, the pingbacks and the signal
// handler would. The workers' processes are one that has exited already, so
// that a stop's SIGTERM reaches nobody. stop ends the loop as a stop signal
// and the workers' exits do, and reports whether it ended.
type adv9Loop struct {
	s     *supervisor
	admin []<-chan []byte
	done  chan error
}

// newAdv9Loop makes the loop over one fake worker per script.
func newAdv9Loop(t *testing.T, scripts ...adminScript) *adv9Loop {
	t.Helper()
	dir := t.TempDir()
	cfgFile := filepath.Join(dir, "caddy.json")
	if err := os.WriteFile(cfgFile, []byte(`{"apps":{"v":"1"}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Skipf("no true(1) to stand for the workers' processes: %v", err)
	}
	n := len(scripts)
	s := &supervisor{
		configFile:   cfgFile,
		config:       []byte(`{"apps":{"v":"1"}}`),
		cfgGen:       1,
		genSeq:       1,
		n:            n,
		startTimeout: time.Minute,
		stopTimeout:  time.Minute,
		events:       make(chan event, 4*n+64),
		sockets:      &fleetSockets{fds: map[string]int{}},
		log:          zap.NewNop(),
	}
	l := &adv9Loop{s: s, done: make(chan error, 1)}
	for id, script := range scripts {
		w := &worker{
			id:      id,
			sock:    filepath.Join(dir, fmt.Sprintf("w%d.sock", id)),
			pidPath: filepath.Join(dir, fmt.Sprintf("w%d.pid", id)),
			gen:     1,
			token:   fmt.Sprintf("token-%d", id),
			proc:    gone.Process,
			running: true,
			started: time.Now(),
			cfgGen:  1,
		}
		l.admin = append(l.admin, adv9Admin(t, w.sock, script))
		s.workers = append(s.workers, w)
	}
	return l
}

func (l *adv9Loop) start() {
	go func() { l.done <- l.s.loop(nil) }()
}

func (l *adv9Loop) send(ev event) { l.s.events <- ev }

func (l *adv9Loop) stop(t *testing.T) {
	t.Helper()
	l.send(event{kind: evSignal, sig: syscall.SIGTERM})
	for id := range l.s.n {
		l.send(event{kind: evExited, id: id, gen: 1})
	}
	select {
	case <-l.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the supervisor's loop did not end after a stop and every worker's exit")
	}
}

// adv9Loaded waits for a configuration load at a fake admin endpoint.
func adv9Loaded(loads <-chan []byte, d time.Duration) ([]byte, bool) {
	select {
	case b := <-loads:
		return b, true
	case <-time.After(d):
		return nil, false
	}
}

// TestAdv9LifeCatchUpWhenWorkerReady: a worker that becomes ready (its
// pingback) running an older configuration than the fleet's, because it
// started while a reload went through, gets the fleet's configuration from
// the loop at once; a ready worker that runs it already gets nothing.
func TestAdv9LifeCatchUpWhenWorkerReady(t *testing.T) {
	l := newAdv9Loop(t, adminScript{}, adminScript{})
	s := l.s
	// The fleet moved to generation 2 while worker 1 was starting with 1.
	s.config, s.cfgGen, s.genSeq = []byte(`{"apps":{"v":"2"}}`), 2, 2
	s.workers[0].ready, s.workers[0].cfgGen = true, 2
	l.start()
	defer l.stop(t)

	l.send(event{kind: evReady, token: s.workers[1].token})
	b, ok := adv9Loaded(l.admin[1], 5*time.Second)
	if !ok {
		t.Fatal("worker 1 became ready running generation 1 of the configuration, and the fleet's generation 2 was not loaded into it")
	}
	if !strings.Contains(string(b), `"v":"2"`) {
		t.Errorf("worker 1 was loaded with %s; want the fleet's configuration, generation 2", b)
	}
	if b, ok := adv9Loaded(l.admin[0], 100*time.Millisecond); ok {
		t.Errorf("worker 0, which runs the fleet's configuration, was loaded again with %s", b)
	}
}

// TestAdv9LifeCatchUpAfterReload: a worker that becomes ready while a
// reload is under way (the reload went only to the workers ready when it
// began) gets the reload's configuration once the reload ends, accepted.
func TestAdv9LifeCatchUpAfterReload(t *testing.T) {
	hold := make(chan struct{})
	l := newAdv9Loop(t, adminScript{holdFrom: 1, hold: hold}, adminScript{})
	s := l.s
	s.workers[0].ready = true
	l.start()
	defer l.stop(t)

	if err := os.WriteFile(s.configFile, []byte(`{"apps":{"v":"2"}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	l.send(event{kind: evSignal, sig: syscall.SIGHUP})
	if b, ok := adv9Loaded(l.admin[0], 5*time.Second); !ok || !strings.Contains(string(b), `"v":"2"`) {
		close(hold)
		t.Fatalf("the reload did not reach worker 0 (loaded %q)", b)
	}
	// The reload is under way (worker 0 holds its answer): worker 1 becomes
	// ready now, too late for it. Its pingback is queued before the
	// reload's outcome, which follows the release.
	l.send(event{kind: evReady, token: s.workers[1].token})
	if b, ok := adv9Loaded(l.admin[1], 100*time.Millisecond); ok {
		close(hold)
		t.Fatalf("worker 1 was loaded with %s while the reload was under way", b)
	}
	close(hold)
	b, ok := adv9Loaded(l.admin[1], 5*time.Second)
	if !ok {
		t.Fatal("worker 1 became ready during a reload, and the reload's configuration was not loaded into it when the reload ended")
	}
	if !strings.Contains(string(b), `"v":"2"`) {
		t.Errorf("worker 1 was loaded with %s; want the reload's configuration", b)
	}
}

// TestReloadRefusersAskedAgain: a reload that one worker refuses and another
// accepts becomes the fleet's configuration, and the worker that refused it
// is asked again, later, until it accepts: the fleet ends on one
// configuration without a restart or another reload.
func TestReloadRefusersAskedAgain(t *testing.T) {
	l := newAdv9Loop(t, adminScript{}, adminScript{refuse: 2})
	s := l.s
	s.retryMin = 50 * time.Millisecond
	for _, w := range s.workers {
		w.ready = true
	}
	l.start()
	defer l.stop(t)

	if err := os.WriteFile(s.configFile, []byte(`{"apps":{"v":"2"}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	l.send(event{kind: evSignal, sig: syscall.SIGHUP})
	for i := range 3 {
		b, ok := adv9Loaded(l.admin[1], 5*time.Second)
		if !ok {
			t.Fatalf("worker 1 refused the reload; load %d of the fleet's configuration never came", i+1)
		}
		if !strings.Contains(string(b), `"v":"2"`) {
			t.Fatalf("worker 1's load %d was %s; want the reload's configuration", i+1, b)
		}
	}
	// Retries after 50, 100 and 200ms: another would come within 400ms.
	if b, ok := adv9Loaded(l.admin[1], time.Second); ok {
		t.Errorf("worker 1 accepted, and was loaded again with %s", b)
	}
	if n := len(l.admin[0]); n != 1 {
		t.Errorf("worker 0 accepted the reload; it was loaded %d times, want once", n)
	}
}

// TestReloadNotHeldByHungWorker: a worker whose admin endpoint takes a load
// and never answers counts as refusing it once the load times out, and the
// next reload reaches the fleet; without the timeout the supervisor would
// stay "reloading" for as long as the worker hangs.
func TestReloadNotHeldByHungWorker(t *testing.T) {
	hung := make(chan struct{})
	defer close(hung)
	l := newAdv9Loop(t, adminScript{}, adminScript{holdFrom: 1, hold: hung})
	s := l.s
	s.loadTimeout = 200 * time.Millisecond
	s.retryMin = time.Minute // no retry of worker 1 within the test
	for _, w := range s.workers {
		w.ready = true
	}
	l.start()
	defer l.stop(t)

	for _, v := range []string{"2", "3"} {
		if err := os.WriteFile(s.configFile, []byte(`{"apps":{"v":"`+v+`"}}`), 0o600); err != nil {
			t.Fatal(err)
		}
		l.send(event{kind: evSignal, sig: syscall.SIGHUP})
		b, ok := adv9Loaded(l.admin[0], 3*time.Second)
		if !ok {
			t.Fatalf("reload to v%s never reached worker 0: worker 1's hung load holds the supervisor", v)
		}
		if !strings.Contains(string(b), `"v":"`+v+`"`) {
			t.Fatalf("worker 0 was loaded with %s; want v%s", b, v)
		}
	}
}
