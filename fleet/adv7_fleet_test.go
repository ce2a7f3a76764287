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
	"testing"
	"time"

	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/spf13/cobra"
	"go.uber.org/zap"

	"github.com/orbitproxy/orbit/internal/freeport"
	"github.com/orbitproxy/orbit/internal/privdir"
)

// adv7RunCommand runs `caddy orbit-fleet` with args in this process, as
// Caddy's main would.
func adv7RunCommand(t *testing.T, args ...string) error {
	t.Helper()
	c, ok := caddycmd.Commands()["orbit-fleet"]
	if !ok {
		t.Fatal("orbit-fleet is not registered")
	}
	cc := &cobra.Command{Use: "orbit-fleet"}
	c.CobraFunc(cc)
	if err := cc.ParseFlags(args); err != nil {
		t.Fatal(err)
	}
	_, err := cmdOrbitFleet(caddycmd.Flags{FlagSet: cc.Flags()})
	return err
}

// TestAdv7FleetPidfileOfRefusedFleet: a second `caddy orbit-fleet` given the
// running fleet's --pidfile, refused because the fleet holds the run
// directory or the address, leaves the pid file alone: an operator's (or an
// init script's) `kill -HUP $(cat pidfile)` still reaches the running fleet.
func TestAdv7FleetPidfileOfRefusedFleet(t *testing.T) {
	dir := t.TempDir()
	runDir := filepath.Join(dir, "run")
	if err := privdir.Ensure(runDir); err != nil {
		t.Fatal(err)
	}
	// The running fleet: it holds the run directory's lock and listens on
	// the address.
	lock, err := lockRunDir(runDir)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	cfg := filepath.Join(dir, "caddy.json")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(`{"apps": {"http": {"servers": {"a": {"listen": [%q]}}}}}`, ln.Addr().String())), 0o600); err != nil {
		t.Fatal(err)
	}
	pidfile := filepath.Join(dir, "fleet.pid")
	const running = "4242\n"
	if err := os.WriteFile(pidfile, []byte(running), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ runDir, want string }{
		{runDir, "another orbit-fleet is running"},
		{filepath.Join(dir, "other-run"), "another process is listening"},
	} {
		err := adv7RunCommand(t, "--config", cfg, "--workers", "1", "--run-dir", c.runDir, "--pidfile", pidfile)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Fatalf("second fleet in %s: %v, want an error saying %q", c.runDir, err, c.want)
		}
		if b, err := os.ReadFile(pidfile); err != nil || string(b) != running {
			t.Errorf("after a second fleet in %s was refused, the pid file holds %q (%v); want the running fleet's %q", c.runDir, b, err, running)
		}
	}
}

// TestAdv7FleetSocketsOpenedAtOnce: two fleets (two supervisors, in two run
// directories) opening the same free address at the same moment: one gets
// it and the other is refused. Both getting it would have the kernel split
// the clients between two fleets, unnoticed, which is what the refusal of a
// taken address is there to prevent.
func TestAdv7FleetSocketsOpenedAtOnce(t *testing.T) {
	for i := range 150 {
		port, err := freeport.Pick()
		if err != nil {
			t.Fatal(err)
		}
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		cfg := []byte(fmt.Sprintf(`{"apps": {"http": {"servers": {"a": {"listen": [%q]}}}}}`, addr))
		var fss [2]*fleetSockets
		var errs [2]error
		var wg sync.WaitGroup
		start := make(chan struct{})
		for j := range 2 {
			wg.Go(func() {
				<-start
				fss[j], errs[j] = openFleetSockets(cfg, 2, false)
			})
		}
		close(start)
		wg.Wait()
		for _, fs := range fss {
			if fs != nil {
				fs.close()
			}
		}
		if errs[0] == nil && errs[1] == nil {
			t.Fatalf("attempt %d: two fleets opened %s at once; the kernel splits its clients between them", i, addr)
		}
		for _, err := range errs {
			if err != nil && !strings.Contains(err.Error(), "another process is listening") {
				t.Fatalf("attempt %d: %v", i, err)
			}
		}
	}
}

// TestCatchUpLoadsFleetConfigIntoLaggingWorkers: a worker that became ready
// running an older configuration than the fleet's (it was starting while a
// reload went through) gets the fleet's configuration; one that already runs
// it, and one that refused it, are left alone.
func TestCatchUpLoadsFleetConfigIntoLaggingWorkers(t *testing.T) {
	dir := t.TempDir()
	var mu sync.Mutex
	loaded := map[int][]byte{}
	admin := func(id int) string {
		sock := filepath.Join(dir, fmt.Sprintf("w%d.sock", id))
		ln, err := net.Listen("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			if r.Method == http.MethodPost && r.URL.Path == "/load" {
				mu.Lock()
				loaded[id] = b
				mu.Unlock()
			}
		})}
		go srv.Serve(ln)
		t.Cleanup(func() { srv.Close() })
		return sock
	}
	s := &supervisor{
		config: []byte(`{"apps":{"v":"2"}}`), cfgGen: 2,
		events:  make(chan event, 1),
		sockets: &fleetSockets{fds: map[string]int{}},
		log:     zap.NewNop(),
	}
	for id, st := range []struct{ cfgGen, refused int }{{2, 0}, {1, 0}, {1, 2}} {
		s.workers = append(s.workers, &worker{id: id, sock: admin(id), running: true, ready: true, gen: 1, cfgGen: st.cfgGen, refused: st.refused})
	}
	s.catchUp()
	if !s.reloading {
		t.Fatal("catchUp loaded nothing")
	}
	var ev event
	select {
	case ev = <-s.events:
	case <-time.After(10 * time.Second):
		t.Fatal("the load did not end")
	}
	if ev.kind != evReloaded || ev.gen != 2 || len(ev.loads) != 1 || ev.loads[0].id != 1 || ev.loads[0].err != nil {
		t.Fatalf("outcome %+v: want worker 1 alone loaded with generation 2", ev)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(loaded) != 1 || !strings.Contains(string(loaded[1]), `"v":"2"`) {
		t.Fatalf("loads by worker: %v; want the fleet's configuration in worker 1 only", loaded)
	}
}

// TestRunDirTooLongForSockets: a run directory under which a worker's admin
// socket would pass sun_path's 107 bytes is refused by name before any worker
// starts; one a byte shorter gets past that check (this test's config is then
// refused for listening nowhere).
func TestRunDirTooLongForSockets(t *testing.T) {
	dir, err := os.MkdirTemp("", "orbit-long-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	cfg := filepath.Join(dir, "caddy.json")
	if err := os.WriteFile(cfg, []byte(`{"admin": {"disabled": true}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	sock := len("/worker-0.01234567.sock")
	for _, c := range []struct {
		over    int
		refused bool
	}{{1, true}, {0, false}} {
		pad := 107 + c.over - sock - len(dir) - 1
		runDir := filepath.Join(dir, strings.Repeat("r", pad))
		err := adv7RunCommand(t, "--config", cfg, "--workers", "1", "--run-dir", runDir)
		if got := err != nil && strings.Contains(err.Error(), "too long for a unix socket"); got != c.refused {
			t.Errorf("run directory of %d bytes (socket path %d bytes): %v; refused for length: %v, want %v",
				len(runDir), len(runDir)+sock, err, got, c.refused)
		}
		if err == nil {
			t.Errorf("run directory of %d bytes: the fleet started with a config that has no admin endpoint", len(runDir))
		}
	}
}
