package fleet

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/orbitproxy/orbit/internal/privdir"
)

// TestAdv36StalePidFilesOtherSpelling: the run directory a killed fleet
// was started with and the one a new fleet is started with may name one
// directory in two ways (a symbolic link among its parents: /run/orbit
// and /var/run/orbit on most hosts). The pid file of a worker of the killed
// fleet, still draining, must be kept whichever spelling each run used,
// and that of a worker of a fleet in another directory still removed.
func TestAdv36StalePidFilesOtherSpelling(t *testing.T) {
	dir := t.TempDir()
	real := filepath.Join(dir, "real")
	if err := os.Mkdir(real, 0o700); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	runDir := filepath.Join(real, "run")
	if err := privdir.Ensure(runDir); err != nil {
		t.Fatal(err)
	}
	otherDir := filepath.Join(dir, "other")
	if err := privdir.Ensure(otherDir); err != nil {
		t.Fatal(err)
	}
	start := func(env string) *exec.Cmd {
		c := exec.Command("sleep", "60")
		c.Env = append(os.Environ(), env)
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Process.Kill(); c.Wait() })
		return c
	}
	pidFile := func(i int) string { return filepath.Join(runDir, "worker-"+strconv.Itoa(i)+".pid") }
	procs := []*exec.Cmd{
		start(idEnv + "=" + filepath.Join(link, "run") + ":1"),
		start(idEnv + "=" + runDir + "/:1"),
		start(idEnv + "=" + otherDir + ":1"),
	}
	for i, c := range procs {
		if err := os.WriteFile(pidFile(i), []byte(strconv.Itoa(c.Process.Pid)+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, spelling := range []string{runDir, filepath.Join(link, "run")} {
		removeStalePidFiles(spelling, nil)
		for i, what := range []string{"through a linked parent", "with a trailing slash"} {
			if _, err := os.Stat(pidFile(i)); err != nil {
				t.Errorf("run directory given as %s: the pid file of a draining worker whose fleet named it %s was removed", spelling, what)
			}
		}
	}
	if _, err := os.Stat(pidFile(2)); err == nil {
		t.Error("the pid file of a worker of another run directory's fleet is left")
	}
}
