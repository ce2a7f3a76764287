package scenario

import (
	"bytes"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/internal/freeport"
	"github.com/orbitproxy/orbit/internal/privdir"
)

// TestAdv36DrainedWorkerPidFileRemovedAtExit: a fleet started in the run
// directory of a killed fleet keeps the pid file of that fleet's worker 2,
// still draining, which it does not rewrite (it has one worker). Once that
// worker has exited, its pid may go to anything; when the new fleet stops,
// worker-2.pid must not be left for an operator's
// `kill $(cat worker-2.pid)`. A process stands for that worker: what makes
// it one is the fleet identity (ORBIT_FLEET_ID, <run directory>:<supervisor
// pid>) a supervisor puts in its workers' environment.
func TestDrainedWorkerPidFileRemovedAtExit(t *testing.T) {
	dir := shortTempDir(t)
	runDir := filepath.Join(dir, "run")
	if err := privdir.Ensure(runDir); err != nil {
		t.Fatal(err)
	}
	draining := exec.Command("sleep", "60")
	draining.Env = append(os.Environ(), "ORBIT_FLEET_ID="+runDir+":1")
	if err := draining.Start(); err != nil {
		t.Fatal(err)
	}
	drained := false
	t.Cleanup(func() {
		if !drained {
			draining.Process.Kill()
			draining.Wait()
		}
	})
	stale := filepath.Join(runDir, "worker-2.pid")
	if err := os.WriteFile(stale, []byte(strconv.Itoa(draining.Process.Pid)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	port, err := freeport.Pick()
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	cfg := filepath.Join(dir, "caddy.json")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(`{"apps":{"http":{"servers":{"s":{"listen":[%q],
		"routes":[{"handle":[{"handler":"static_response","body":"ok"}]}]}}}}}`, addr)), 0o600); err != nil {
		t.Fatal(err)
	}
	fl := exec.Command(caddyBin, "orbit-fleet", "--config", cfg, "--workers", "1", "--run-dir", runDir)
	if err := fl.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- fl.Wait() }()
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			fl.Process.Kill()
			<-exited
		}
	})
	c := &http.Client{Timeout: time.Second}
	for deadline := time.Now().Add(30 * time.Second); ; {
		if r, err := c.Get("http://" + addr + "/"); err == nil {
			r.Body.Close()
			if r.StatusCode == 200 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("the fleet did not serve within 30s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := os.Stat(stale); err != nil {
		t.Fatalf("the pid file of a worker still draining was removed: %v", err)
	}

	// The earlier fleet's worker 2 ends its drain; then the fleet stops.
	draining.Process.Kill()
	draining.Wait()
	drained = true
	fl.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
		stopped = true
	case <-time.After(30 * time.Second):
		t.Fatal("the fleet did not stop within 30s of SIGTERM")
	}
	if b, err := os.ReadFile(stale); err == nil {
		t.Errorf("worker-2.pid, with the pid %s of a process that exited, is left once the fleet stopped", bytes.TrimSpace(b))
	}
}
