package fleet

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
)

// removeStalePidFiles removes the workers' pid files in runDir whose process
// is no longer a worker of a fleet in runDir: a supervisor that was killed
// leaves them, and no later run rewrites those of a worker index it does
// not have. Once the worker has exited, the kernel may give its pid to
// anything, and a `kill $(cat worker-<i>.pid)` would reach that. The pid
// files of the killed fleet's workers still draining are kept. The run
// directory's lock makes these files this run's to remove.
func removeStalePidFiles(runDir string) {
	names, _ := filepath.Glob(filepath.Join(runDir, "worker-*.pid"))
	for _, p := range names {
		if !isFleetWorker(p, runDir) {
			os.Remove(p)
		}
	}
}

// isFleetWorker reports whether the process in pid file p is a worker of a
// fleet run in runDir, by the fleet identity its supervisor put in its
// environment (idEnv).
func isFleetWorker(p, runDir string) bool {
	b, err := os.ReadFile(p)
	if err != nil {
		return false
	}
	pid, err := strconv.Atoi(string(bytes.TrimSpace(b)))
	if err != nil || pid <= 0 {
		return false
	}
	env, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "environ"))
	if err != nil {
		return false // gone, or another user's
	}
	id := []byte(idEnv + "=" + runDir + ":")
	for kv := range bytes.SplitSeq(env, []byte{0}) {
		if bytes.HasPrefix(kv, id) {
			return true
		}
	}
	return false
}
