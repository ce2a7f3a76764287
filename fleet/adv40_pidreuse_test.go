package fleet

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/internal/privdir"
)

// TestAdv40StalePidFileNamingOwnWorker: a killed fleet's worker-3.pid
// outlives its worker, draining when this fleet of one started, and the
// kernel gives its pid to this fleet's worker 0 (restarted meanwhile).
// The file names a process that is not worker 3: `kill $(cat
// worker-3.pid)` would stop this fleet's worker 0. The sweep removes it,
// and keeps worker-0.pid.
func TestAdv40StalePidFileNamingOwnWorker(t *testing.T) {
	runDir := filepath.Join(t.TempDir(), "run")
	if err := privdir.Ensure(runDir); err != nil {
		t.Fatal(err)
	}
	own := startSleeper(t, idEnv+"="+runDir+":1")
	pidFile := func(i int) string { return filepath.Join(runDir, "worker-"+strconv.Itoa(i)+".pid") }
	for _, i := range []int{0, 3} {
		if err := os.WriteFile(pidFile(i), []byte(strconv.Itoa(own.Process.Pid)+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	s := &supervisor{runDir: runDir, pidSweep: time.Hour, events: make(chan event, 4), done: make(chan struct{})}
	defer close(s.done)
	s.workers = []*worker{{id: 0, pidPath: pidFile(0), proc: own.Process, running: true}}
	s.sweepPidFiles()
	if s.pidTimer != nil {
		s.pidTimer.Stop()
	}
	if _, err := os.Stat(pidFile(3)); err == nil {
		t.Error("worker-3.pid, which names this fleet's worker 0 (its pid reused), is left while the fleet runs")
	}
	if _, err := os.Stat(pidFile(0)); err != nil {
		t.Errorf("this fleet's worker's pid file was removed: %v", err)
	}
}

// TestOwnWorkerPidFileKeptBeforeItsEnvironShows: for a moment after exec,
// a worker's /proc/<pid>/environ reads empty, and a sweep then could not
// tell it from a stranger by its fleet identity. The supervisor knows its
// own workers' pids; their files are kept whatever /proc shows. The
// sleeper here carries no fleet identity at all, as a worker just exec'd
// shows none.
func TestOwnWorkerPidFileKeptBeforeItsEnvironShows(t *testing.T) {
	runDir := filepath.Join(t.TempDir(), "run")
	if err := privdir.Ensure(runDir); err != nil {
		t.Fatal(err)
	}
	own := startSleeper(t)
	pidFile := filepath.Join(runDir, "worker-0.pid")
	if err := os.WriteFile(pidFile, []byte(strconv.Itoa(own.Process.Pid)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s := &supervisor{runDir: runDir, pidSweep: time.Hour, events: make(chan event, 4), done: make(chan struct{})}
	defer close(s.done)
	s.workers = []*worker{{id: 0, pidPath: pidFile, proc: own.Process, running: true}}
	s.sweepPidFiles()
	if s.pidTimer != nil {
		s.pidTimer.Stop()
	}
	if _, err := os.Stat(pidFile); err != nil {
		t.Errorf("the running worker's own pid file was removed: %v", err)
	}
}
