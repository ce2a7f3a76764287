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
// files of the killed fleet's workers still draining are kept; a fleet runs
// this as it starts and again as it stops, so that one whose worker exits
// meanwhile is gone by then. The run directory's lock makes these files
// this run's to remove.
func removeStalePidFiles(runDir string) {
	dir, err := os.Stat(runDir)
	if err != nil {
		return
	}
	names, _ := filepath.Glob(filepath.Join(runDir, "worker-*.pid"))
	for _, p := range names {
		if !isFleetWorker(p, dir) {
			os.Remove(p)
		}
	}
}

// isFleetWorker reports whether the process in pid file p is a worker of a
// fleet run in the directory runDir, by the fleet identity its supervisor
// put in its environment (idEnv). The directory, not its name, is compared:
// the killed fleet may have named it another way (a linked parent, as
// /var/run is of /run on most hosts), and its draining workers' pid files
// must be kept all the same.
func isFleetWorker(p string, runDir os.FileInfo) bool {
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
	prefix := []byte(idEnv + "=")
	for kv := range bytes.SplitSeq(env, []byte{0}) {
		id, ok := bytes.CutPrefix(kv, prefix)
		if !ok {
			continue
		}
		// <run directory>:<supervisor pid>; the directory may hold a colon.
		i := bytes.LastIndexByte(id, ':')
		if i < 0 {
			return false
		}
		fi, err := os.Stat(string(id[:i]))
		return err == nil && os.SameFile(fi, runDir)
	}
	return false
}
