package fleet

import (
	"bytes"
	"cmp"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"
)

// removeStalePidFiles removes the workers' pid files in runDir whose process
// is no longer a worker of a fleet in runDir: a supervisor that was killed
// leaves them, and no later run rewrites those of a worker index it does
// not have. Once the worker has exited, the kernel may give its pid to
// anything, and a `kill $(cat worker-<i>.pid)` would reach that. The pid
// files of the killed fleet's workers still draining are kept, and counted
// in others. A file whose pid ours names as this run's own worker is not
// counted, and is removed unless it is that worker's own file (the kernel
// gave an exited worker's pid to ours). A fleet runs this as it starts,
// again while others remain (see sweepPidFiles), and as it stops. The run
// directory's lock makes these files this run's to remove.
func removeStalePidFiles(runDir string, ours func(pid int) (name string, own bool)) (others int) {
	dir, err := os.Stat(runDir)
	if err != nil {
		return 0
	}
	names, _ := filepath.Glob(filepath.Join(runDir, "worker-*.pid"))
	for _, p := range names {
		pid, ok := readPid(p)
		if ok && ours != nil {
			// This run's own workers are known without /proc: a worker
			// just exec'd may show an empty environ for a moment.
			if name, own := ours(pid); own {
				if name != filepath.Base(p) {
					os.Remove(p) // its pid given to one of ours
				}
				continue
			}
		}
		if !ok || !fleetWorker(pid, dir) {
			os.Remove(p)
			continue
		}
		others++
	}
	return others
}

// readPid returns the pid in pid file p.
func readPid(p string) (int, bool) {
	b, err := os.ReadFile(p)
	if err != nil {
		return 0, false
	}
	pid, err := strconv.Atoi(string(bytes.TrimSpace(b)))
	return pid, err == nil && pid > 0
}

// fleetWorker reports whether process pid is a worker of a fleet run in
// the directory runDir, by the fleet identity its supervisor put in its
// environment (idEnv). The directory, not its name, is compared: the
// killed fleet may have named it another way (a linked parent, as /var/run
// is of /run on most hosts), and its draining workers' pid files must be
// kept all the same.
func fleetWorker(pid int, runDir os.FileInfo) bool {
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

// pidSweepEvery is how often a fleet that started beside workers of a
// killed fleet, still draining, looks for their pid files to remove.
const pidSweepEvery = 10 * time.Second

// sweepPidFiles removes the pid files of the killed fleet's workers that
// have exited since the last look, and looks again while any remain.
func (s *supervisor) sweepPidFiles() {
	s.pidTimer = nil
	ours := func(pid int) (string, bool) {
		i := slices.IndexFunc(s.workers, func(w *worker) bool { return w.running && w.proc != nil && w.proc.Pid == pid })
		if i < 0 {
			return "", false
		}
		return filepath.Base(s.workers[i].pidPath), true
	}
	if removeStalePidFiles(s.runDir, ours) > 0 && !s.stopping {
		s.armPidSweep()
	}
}

func (s *supervisor) armPidSweep() {
	s.pidTimer = time.AfterFunc(cmp.Or(s.pidSweep, pidSweepEvery), func() { s.send(event{kind: evSweepPids}) })
}
