package fleet

import (
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/orbitproxy/orbit/internal/privdir"
)

// TestAdv35StaleLinksOfEarlierRun: a fleet of three whose supervisor was
// killed leaves its links worker-<i>.sock behind. Worker 1 was killed too,
// which leaves its socket file, refusing connections; worker 2 exited, which
// removed its socket; worker 0 still drains. A fleet of one started in the
// run directory removes worker 1's dead socket, and must not leave
// the killed supervisor's temporary link, nor leave the
// documented names worker-1.sock and worker-2.sock leading nowhere (an
// operator's `caddy reload --address unix/<run>/worker-1.sock` would fail
// with "no such file or directory" on a name ls shows). The link to the
// draining worker 0 is the new fleet's own while it runs; once it exits
// with its old worker 0 still draining, worker-0.sock is gone, and nothing
// else of the fleet's is left.
func TestAdv35StaleLinksOfEarlierRun(t *testing.T) {
	dir, err := os.MkdirTemp("", "orbit-a35-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	runDir := filepath.Join(dir, "run")
	if err := privdir.Ensure(runDir); err != nil {
		t.Fatal(err)
	}
	old := adminSockets{dir: runDir, run: "0badc0de"}
	// Worker 0 of the killed fleet, still draining: its admin socket
	// answers.
	live, err := net.Listen("unix", old.path(0))
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	// Worker 1, killed: its socket file is left, and refuses connections.
	dead, err := net.Listen("unix", old.path(1))
	if err != nil {
		t.Fatal(err)
	}
	dead.(*net.UnixListener).SetUnlinkOnClose(false)
	dead.Close()
	// Worker 2 exited: its socket is gone. The killed supervisor's links
	// are all left.
	for i := range 3 {
		if err := old.point(i); err != nil {
			t.Fatal(err)
		}
	}
	// And a temporary link, killed between point's two steps.
	tmp := old.link(1) + "." + old.run + ".tmp"
	if err := os.Symlink(filepath.Base(old.path(1)), tmp); err != nil {
		t.Fatal(err)
	}

	cfg := filepath.Join(dir, "caddy.json")
	if err := os.WriteFile(cfg, []byte(`{"admin": {"disabled": true}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	// The config is refused once the fleet has set up its admin sockets'
	// names (no worker could run it): the run's start and exit, with no
	// worker.
	if err := adv7RunCommand(t, "--config", cfg, "--workers", "1", "--run-dir", runDir); err == nil {
		t.Fatal("a config with the admin endpoint off was run")
	}
	if _, err := os.Lstat(old.path(1)); err == nil {
		t.Errorf("the dead socket %s of the earlier run is left", old.path(1))
	}
	if _, err := os.Lstat(old.path(0)); err != nil {
		t.Errorf("the socket of a worker still draining was removed: %v", err)
	}
	if _, err := os.Lstat(tmp); err == nil {
		t.Errorf("the earlier run's temporary link %s is left", filepath.Base(tmp))
	}
	for i := range 3 {
		p := old.link(i)
		if _, err := os.Lstat(p); err == nil {
			target, _ := os.Readlink(p)
			_, serr := os.Stat(p)
			t.Errorf("%s is left behind, a link to %s (%v)", filepath.Base(p), target, serr)
		}
	}
}
