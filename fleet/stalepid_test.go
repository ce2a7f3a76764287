package fleet

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/internal/privdir"
)

// startSleeper starts a process that sleeps for a minute, with env added
// to this one's, and kills it when the test ends. It returns once the
// process's environment shows in /proc: for a moment after exec it reads
// empty, and the sleeper stands for a worker that has long been running.
func startSleeper(t *testing.T, env ...string) *exec.Cmd {
	t.Helper()
	c := exec.Command("sleep", "60")
	c.Env = append(os.Environ(), env...)
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Process.Kill(); c.Wait() })
	environ := filepath.Join("/proc", strconv.Itoa(c.Process.Pid), "environ")
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		if b, err := os.ReadFile(environ); err == nil && len(b) > 0 {
			return c
		}
		if time.Now().After(deadline) {
			t.Fatalf("sleeper %d shows no environment", c.Process.Pid)
		}
	}
}

// TestStalePidFilesOfEarlierRun: a fleet of three whose supervisor was
// killed leaves worker-<i>.pid behind. A fleet of one started in the run
// directory writes worker-0.pid, and nothing rewrites worker-1.pid or
// worker-2.pid: once their workers have exited, the kernel may give those
// pids to anything, and an operator's `kill $(cat worker-1.pid)` would
// reach it. A pid file whose process is not a worker of a fleet in this
// run directory is removed; one whose process still is (a worker of the
// killed fleet, draining) is kept.
func TestStalePidFilesOfEarlierRun(t *testing.T) {
	dir, err := os.MkdirTemp("", "orbit-pid-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	runDir := filepath.Join(dir, "run")
	if err := privdir.Ensure(runDir); err != nil {
		t.Fatal(err)
	}
	draining := startSleeper(t, idEnv+"="+runDir+":1")
	stranger := startSleeper(t)
	other := startSleeper(t, idEnv+"="+filepath.Join(dir, "elsewhere")+":1")
	pidFile := func(i int) string { return filepath.Join(runDir, "worker-"+strconv.Itoa(i)+".pid") }
	for i, c := range []*exec.Cmd{draining, stranger, other} {
		if err := os.WriteFile(pidFile(i+1), []byte(strconv.Itoa(c.Process.Pid)+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// An exited worker's pid, and a file that holds no pid.
	if err := os.WriteFile(pidFile(4), []byte("999999999\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(pidFile(5), []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}

	cfg := filepath.Join(dir, "caddy.json")
	if err := os.WriteFile(cfg, []byte(`{"admin": {"disabled": true}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	// Refused once the run directory is the fleet's (no worker could run
	// the config): the run's start and exit, with no worker.
	if err := adv7RunCommand(t, "--config", cfg, "--workers", "1", "--run-dir", runDir); err == nil {
		t.Fatal("a config with the admin endpoint off was run")
	}
	if _, err := os.Stat(pidFile(1)); err != nil {
		t.Errorf("the pid file of a worker of the earlier run, still draining, was removed: %v", err)
	}
	for i, what := range map[int]string{2: "a process of no fleet", 3: "a worker of another run directory's fleet", 4: "an exited process", 5: "no pid"} {
		if _, err := os.Stat(pidFile(i)); err == nil {
			t.Errorf("worker-%d.pid, with the pid of %s, is left", i, what)
		}
	}
}

// TestStalePidFileRemovedWhileFleetRuns: a fleet that starts beside a
// draining worker of a killed fleet keeps that worker's pid file, and
// looks again while it runs: once the worker has exited, its pid file goes
// then, not when this fleet stops. This fleet's own workers' pid files are
// kept, and do not keep the sweep going.
func TestStalePidFileRemovedWhileFleetRuns(t *testing.T) {
	runDir := filepath.Join(t.TempDir(), "run")
	if err := privdir.Ensure(runDir); err != nil {
		t.Fatal(err)
	}
	id := idEnv + "=" + runDir + ":1"
	draining, own := startSleeper(t, id), startSleeper(t, id)
	pidFile := func(i int) string { return filepath.Join(runDir, "worker-"+strconv.Itoa(i)+".pid") }
	for i, c := range map[int]*exec.Cmd{0: own, 3: draining} {
		if err := os.WriteFile(pidFile(i), []byte(strconv.Itoa(c.Process.Pid)+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	s := &supervisor{runDir: runDir, pidSweep: 10 * time.Millisecond, events: make(chan event, 4), done: make(chan struct{})}
	defer close(s.done)
	s.workers = []*worker{{id: 0, pidPath: pidFile(0), proc: own.Process, running: true}}

	s.sweepPidFiles()
	if _, err := os.Stat(pidFile(3)); err != nil {
		t.Fatalf("the draining worker's pid file was removed: %v", err)
	}
	if s.pidTimer == nil {
		t.Fatal("no further sweep armed while the draining worker runs")
	}
	select {
	case ev := <-s.events:
		if ev.kind != evSweepPids {
			t.Fatalf("event %+v; want a sweep", ev)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no sweep within 5s")
	}
	draining.Process.Kill()
	draining.Wait()
	s.sweepPidFiles()
	if _, err := os.Stat(pidFile(3)); err == nil {
		t.Error("the pid file of the draining worker that exited is left while the fleet runs")
	}
	if _, err := os.Stat(pidFile(0)); err != nil {
		t.Errorf("this fleet's worker's pid file was removed: %v", err)
	}
	if s.pidTimer != nil {
		t.Error("a sweep is armed with no worker of the killed fleet left")
	}
}
