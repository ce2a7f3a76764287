package fleet

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// adv18Admin is a worker's admin endpoint, faked as Caddy runs /load: one
// load at a time (Caddy's rawCfgMu), in the order they arrive, each applied
// only when the test releases it (or at once after auto is closed).
// applied records what the worker runs, load by load.
type adv18Admin struct {
	arrived chan []byte   // each load, as it arrives
	gate    chan struct{} // one token lets the load at the head apply
	auto    chan struct{} // closed: every load applies at once

	mu      sync.Mutex
	cond    *sync.Cond
	tickets int // loads arrived
	next    int // the load that may apply next
	applied []string
}

func newAdv18Admin(t *testing.T, sock string) *adv18Admin {
	t.Helper()
	a := &adv18Admin{arrived: make(chan []byte, 64), gate: make(chan struct{}), auto: make(chan struct{})}
	a.cond = sync.NewCond(&a.mu)
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if r.Method != http.MethodPost || r.URL.Path != "/load" {
			return
		}
		a.mu.Lock()
		ticket := a.tickets
		a.tickets++
		a.arrived <- b
		for a.next != ticket {
			a.cond.Wait()
		}
		a.mu.Unlock()
		// This load holds the worker's config lock: wait for the test.
		select {
		case <-a.gate:
		case <-a.auto:
		}
		a.mu.Lock()
		a.applied = append(a.applied, adv18Version(b))
		a.next++
		a.cond.Broadcast()
		a.mu.Unlock()
	})}
	go srv.Serve(ln)
	t.Cleanup(func() {
		select {
		case <-a.auto:
		default:
			close(a.auto)
		}
		srv.Close()
	})
	return a
}

// adv18Version is the "v" of a configuration as loaded into a worker.
func adv18Version(b []byte) string {
	s := string(b)
	i := strings.Index(s, `"v":"`)
	if i < 0 {
		return "?"
	}
	s = s[i+5:]
	return s[:strings.IndexByte(s, '"')]
}

func (a *adv18Admin) release(t *testing.T) {
	t.Helper()
	select {
	case a.gate <- struct{}{}:
	case <-time.After(5 * time.Second):
		t.Fatal("no load waiting to apply")
	}
}

func (a *adv18Admin) wantArrival(t *testing.T, v string) {
	t.Helper()
	select {
	case b := <-a.arrived:
		if got := adv18Version(b); got != v {
			t.Fatalf("load of v%s arrived; want v%s", got, v)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("no load of v%s arrived", v)
	}
}

// wantNoArrival fails if a load arrives within d, or has arrived already.
func (a *adv18Admin) wantNoArrival(t *testing.T, d time.Duration) {
	t.Helper()
	select {
	case b := <-a.arrived:
		t.Fatalf("load of v%s arrived; want none", adv18Version(b))
	case <-time.After(d):
	}
}

func (a *adv18Admin) runs() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.applied) == 0 {
		return "1"
	}
	return a.applied[len(a.applied)-1]
}

func (a *adv18Admin) history() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.applied...)
}

// newAdv18Loop is adv9's loop over n workers whose admin endpoints are
// adv18Admins, each worker ready, loads timing out after timeout.
func newAdv18Loop(t *testing.T, n int, timeout time.Duration) (*adv9Loop, []*adv18Admin) {
	t.Helper()
	dir, err := os.MkdirTemp("/tmp", "adv18")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	l := newAdv9Loop(t, make([]adminScript, n)...) // its admins are replaced below
	s := l.s
	s.loadTimeout = timeout
	s.retryMin = time.Minute // no retry within the test
	var admins []*adv18Admin
	for i, w := range s.workers {
		w.ready = true
		w.sock = filepath.Join(dir, fmt.Sprintf("a%d.sock", i))
		admins = append(admins, newAdv18Admin(t, w.sock))
	}
	return l, admins
}

func adv18Reload(t *testing.T, l *adv9Loop, v string) {
	t.Helper()
	if err := os.WriteFile(l.s.configFile, []byte(`{"apps":{"v":"`+v+`"}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	l.send(event{kind: evSignal, sig: syscall.SIGHUP})
}

// adv18Settle lets every worker apply what it was sent, stops the loop, and
// checks that the fleet's configuration is want and every worker runs it.
func adv18Settle(t *testing.T, l *adv9Loop, admins []*adv18Admin, want string) {
	t.Helper()
	for _, a := range admins {
		close(a.auto)
	}
	time.Sleep(time.Second)
	l.stop(t)
	if got := adv18Version(l.s.config); got != want {
		t.Errorf("the fleet's configuration is v%s (generation %d); want v%s, the last reload, which the workers applied", got, l.s.cfgGen, want)
	}
	for i, a := range admins {
		if got := a.runs(); got != want || l.s.workers[i].cfgGen != l.s.cfgGen {
			t.Errorf("worker %d runs v%s (loads applied: %v), the supervisor records it at generation %d; the fleet's is v%s, generation %d",
				i, got, a.history(), l.s.workers[i].cfgGen, adv18Version(l.s.config), l.s.cfgGen)
		}
	}
}

// TestAdv18HoldingWorkerNotCaughtUp: two reloads (v2, v3) time out on both
// workers, which apply them later, in order. Worker 0's late v2 makes v2
// the fleet's. Worker 1 still holds both loads: a catch-up to v2 sent now
// would queue behind them and, applied last, take worker 1 back from v3,
// the operator's last reload, to v2 (and its outcome, in time, made the
// fleet go back to v2 once). No load is sent to worker 1 until it answers
// both; then every worker runs v3, and the fleet's configuration is v3.
func TestAdv18HoldingWorkerNotCaughtUp(t *testing.T) {
	l, a := adv18TwoLateReloads(t)
	a[0].release(t) // worker 0 applies v2: late answer, v2 is the fleet's
	a[1].wantNoArrival(t, adv18Timeout)
	a[0].release(t) // worker 0 applies v3: late answer, v3 is the fleet's
	a[1].release(t) // v2, late
	a[1].wantNoArrival(t, 100*time.Millisecond)
	a[1].release(t) // v3, late
	adv18Settle(t, l, a, "3")
	a[1].wantNoArrival(t, 0)
}

// adv18Timeout is the load timeout of the adv18 loops.
const adv18Timeout = 500 * time.Millisecond

// adv18TwoLateReloads starts a loop over two workers and reloads it to v2,
// then v3, each load timing out on both workers (every worker "refused"),
// which hold both loads, v2 first, until the test releases them.
func adv18TwoLateReloads(t *testing.T) (*adv9Loop, []*adv18Admin) {
	t.Helper()
	l, a := newAdv18Loop(t, 2, adv18Timeout)
	l.start()
	for _, v := range []string{"2", "3"} {
		adv18Reload(t, l, v)
		a[0].wantArrival(t, v)
		a[1].wantArrival(t, v)
		time.Sleep(adv18Timeout + 300*time.Millisecond)
	}
	return l, a
}
