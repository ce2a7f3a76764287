package scenario

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// clockTick is the unit of the times in /proc/<pid>/stat (USER_HZ, which
// Linux fixes at 100 on every architecture it reports to user space).
const clockTick = 10 * time.Millisecond

// proxyCPU is treeCPU of p's root process; an error without a proxy.
func proxyCPU(p Proxy) (time.Duration, error) {
	if p == nil {
		return 0, errors.New("no proxy")
	}
	return treeCPU(p.PID())
}

// treeCPU is the CPU time, user and system, that process root and its
// children have used: each one's own, and that of the children each has
// waited for (a worker that died and was restarted), as /proc counts them.
// A proxy's processes are its root (a supervisor or a master) and the
// workers it starts, so the difference of two readings is what the proxy
// spent between them.
func treeCPU(root int) (time.Duration, error) {
	own, _, err := procCPU(strconv.Itoa(root))
	if err != nil {
		return 0, err
	}
	total := own
	dirs, err := filepath.Glob("/proc/[0-9]*")
	if err != nil {
		return 0, err
	}
	for _, d := range dirs {
		cpu, ppid, err := procCPU(filepath.Base(d))
		if err == nil && ppid == root {
			total += cpu
		}
	}
	return total, nil
}

// procCPU reads one process's utime, stime, cutime and cstime, and its
// parent.
func procCPU(pid string) (cpu time.Duration, ppid int, err error) {
	b, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return 0, 0, err
	}
	// The command name, in parentheses, may hold spaces: fields are
	// counted from its closing parenthesis.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, fmt.Errorf("/proc/%s/stat: no command name", pid)
	}
	f := bytes.Fields(b[i+1:])
	// After the name: state(0) ppid(1) ... utime(11) stime(12) cutime(13) cstime(14).
	if len(f) < 15 {
		return 0, 0, fmt.Errorf("/proc/%s/stat: %d fields", pid, len(f))
	}
	if ppid, err = strconv.Atoi(string(f[1])); err != nil {
		return 0, 0, fmt.Errorf("/proc/%s/stat: ppid: %w", pid, err)
	}
	var ticks int64
	for _, s := range f[11:15] {
		n, err := strconv.ParseInt(string(s), 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("/proc/%s/stat: %w", pid, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * clockTick, ppid, nil
}
