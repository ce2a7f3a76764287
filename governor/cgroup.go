package governor

import (
	"bufio"
	"io/fs"
	"path"
	"strconv"
	"strings"
)

// cgroup v1 reports "no memory limit" as the largest page-aligned int64;
// anything this large is no limit at all.
const v1Unlimited = 1 << 62

// mount is where one cgroup hierarchy is visible: its root inside the
// hierarchy, and its mount point in the filesystem.
type mount struct{ root, point string }

// cgroupLimits reads the CPU quota (in CPUs) and memory limit (in bytes) of
// the calling process's cgroup, taking the tightest value along its ancestry,
// since any ancestor's limit applies too. fsys is the filesystem root, so
// that tests can supply a fake /proc and /sys. Zero means no limit found.
func cgroupLimits(fsys fs.FS) (cpu float64, mem uint64) {
	v2path, v1paths := readProcCgroup(fsys)
	v2mount, v1mounts := readMountinfo(fsys)

	// A controller is attached to one hierarchy only: on hybrid hosts it is
	// under v1 when a v1 hierarchy lists it, and under v2 otherwise.
	if p, m, ok := pick("cpu", v1paths, v1mounts); ok {
		walk(fsys, p, m, func(dir string) {
			quota, ok1 := readInt(fsys, path.Join(dir, "cpu.cfs_quota_us"))
			period, ok2 := readInt(fsys, path.Join(dir, "cpu.cfs_period_us"))
			if ok1 && ok2 && quota > 0 && period > 0 {
				cpu = minKnown(cpu, float64(quota)/float64(period))
			}
		})
	} else if v2mount != nil && v2path != "" {
		walk(fsys, v2path, *v2mount, func(dir string) {
			f := strings.Fields(readString(fsys, path.Join(dir, "cpu.max")))
			if len(f) != 2 || f[0] == "max" {
				return
			}
			quota, err1 := strconv.ParseFloat(f[0], 64)
			period, err2 := strconv.ParseFloat(f[1], 64)
			if err1 == nil && err2 == nil && quota > 0 && period > 0 {
				cpu = minKnown(cpu, quota/period)
			}
		})
	}

	if p, m, ok := pick("memory", v1paths, v1mounts); ok {
		walk(fsys, p, m, func(dir string) {
			n, ok := readInt(fsys, path.Join(dir, "memory.limit_in_bytes"))
			if ok && n > 0 && n < v1Unlimited {
				mem = minKnown(mem, uint64(n))
			}
		})
	} else if v2mount != nil && v2path != "" {
		walk(fsys, v2path, *v2mount, func(dir string) {
			n, ok := readInt(fsys, path.Join(dir, "memory.max"))
			if ok && n > 0 {
				mem = minKnown(mem, uint64(n))
			}
		})
	}
	return cpu, mem
}

func minKnown[T float64 | uint64](cur, v T) T {
	if cur == 0 {
		return v
	}
	return min(cur, v)
}

func pick(ctrl string, paths map[string]string, mounts map[string]mount) (string, mount, bool) {
	p, ok1 := paths[ctrl]
	m, ok2 := mounts[ctrl]
	return p, m, ok1 && ok2
}

// readProcCgroup parses /proc/self/cgroup: "0::/path" for v2, and
// "id:ctrl1,ctrl2:/path" for each v1 hierarchy.
func readProcCgroup(fsys fs.FS) (v2 string, v1 map[string]string) {
	v1 = make(map[string]string)
	eachLine(fsys, "proc/self/cgroup", func(line string) {
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 {
			return
		}
		if f[0] == "0" && f[1] == "" {
			v2 = f[2]
			return
		}
		for _, c := range strings.Split(f[1], ",") {
			v1[c] = f[2]
		}
	})
	return v2, v1
}

// readMountinfo finds the cgroup2 mount and, per controller, the v1 mounts,
// from /proc/self/mountinfo (see proc(5)): the fourth and fifth fields are
// the mount's root and mount point, and after the " - " separator come the
// filesystem type, the source and the super options, which for v1 list the
// controllers.
func readMountinfo(fsys fs.FS) (v2 *mount, v1 map[string]mount) {
	v1 = make(map[string]mount)
	eachLine(fsys, "proc/self/mountinfo", func(line string) {
		pre, post, ok := strings.Cut(line, " - ")
		if !ok {
			return
		}
		pf, qf := strings.Fields(pre), strings.Fields(post)
		if len(pf) < 5 || len(qf) < 3 {
			return
		}
		m := mount{root: unescape(pf[3]), point: unescape(pf[4])}
		switch qf[0] {
		case "cgroup2":
			if v2 == nil {
				v2 = &m
			}
		case "cgroup":
			for _, opt := range strings.Split(qf[2], ",") {
				if _, seen := v1[opt]; !seen {
					v1[opt] = m
				}
			}
		}
	})
	return v2, v1
}

// unescape undoes mountinfo's octal escapes (\040 for a space, and so on).
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// walk calls fn for the directory of cgroup p under mount m and each of its
// ancestors up to the mount point. When p is not under the mount's root (a
// container that sees only its own part of the hierarchy without a cgroup
// namespace), the mount point itself is the process's cgroup.
func walk(fsys fs.FS, p string, m mount, fn func(dir string)) {
	rel := p
	if m.root != "/" {
		if r, ok := strings.CutPrefix(p, m.root); ok && (r == "" || r[0] == '/') {
			rel = r
		} else {
			rel = "/"
		}
	}
	top := path.Clean(m.point)
	dir := path.Join(top, rel)
	for {
		fn(fsPath(dir))
		if dir == top || dir == "/" || !strings.HasPrefix(dir, top) {
			return
		}
		dir = path.Dir(dir)
	}
}

// fsPath turns an absolute path into an fs.FS path rooted at "/".
func fsPath(p string) string {
	p = strings.TrimPrefix(path.Clean(p), "/")
	if p == "" {
		return "."
	}
	return p
}

func readString(fsys fs.FS, name string) string {
	b, err := fs.ReadFile(fsys, name)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// readInt reads a single integer file. "max" and unparsable content read as
// absent.
func readInt(fsys fs.FS, name string) (int64, bool) {
	n, err := strconv.ParseInt(readString(fsys, name), 10, 64)
	if err != nil {
		return 0, false
	}
	return n, true
}

func eachLine(fsys fs.FS, name string, fn func(string)) {
	f, err := fsys.Open(name)
	if err != nil {
		return
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for sc.Scan() {
		fn(sc.Text())
	}
}
