package fleet

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// A worker's admin socket is named for its fleet's run (worker-<i>.<run>.sock)
// and reached through a symbolic link of the stable name, worker-<i>.sock,
// which the fleet points at its own. A listener unlinks its socket's path as
// it closes: had every fleet's worker <i> listened on worker-<i>.sock, the
// workers of a fleet whose supervisor was killed, exiting once drained, would
// remove the sockets of the fleet started after it in the same run directory,
// whose supervisor could then no longer reach its workers.

// maxSocketPath is the longest path a unix socket can be bound at: the
// kernel's sun_path, less its terminating NUL.
const maxSocketPath = len(syscall.RawSockaddrUnix{}.Path) - 1

// adminSockets names the admin sockets of one run of a fleet.
type adminSockets struct {
	dir string
	run string // random, for this run of the supervisor
}

func newAdminSockets(dir string) (adminSockets, error) {
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		return adminSockets{}, fmt.Errorf("naming admin sockets: %w", err)
	}
	return adminSockets{dir: dir, run: hex.EncodeToString(b[:])}, nil
}

// path is where worker i listens.
func (a adminSockets) path(i int) string {
	return filepath.Join(a.dir, fmt.Sprintf("worker-%d.%s.sock", i, a.run))
}

// link is the stable name of worker i's socket.
func (a adminSockets) link(i int) string {
	return filepath.Join(a.dir, fmt.Sprintf("worker-%d.sock", i))
}

// point makes worker i's stable name lead to this run's socket, replacing
// whatever held the name.
func (a adminSockets) point(i int) error {
	tmp := a.link(i) + "." + a.run + ".tmp"
	os.Remove(tmp)
	if err := os.Symlink(filepath.Base(a.path(i)), tmp); err != nil {
		return fmt.Errorf("linking worker %d's admin socket: %w", i, err)
	}
	if err := os.Rename(tmp, a.link(i)); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("linking worker %d's admin socket: %w", i, err)
	}
	return nil
}

// unpoint removes worker i's stable name if it still leads to this run's
// socket: a fleet started since in the run directory may have taken it. It
// removes the socket too if nothing listens there: a worker stopped while it
// reloaded can exit without closing its admin listener, which would have
// unlinked it.
func (a adminSockets) unpoint(i int) {
	if target, err := os.Readlink(a.link(i)); err == nil && target == filepath.Base(a.path(i)) {
		os.Remove(a.link(i))
	}
	removeUnserved(a.path(i))
}

// removeUnserved removes the unix socket at p if nothing listens on it: its
// process exited or was killed, which leaves the file. One still served is
// left, as is anything else at p.
func removeUnserved(p string) {
	if fi, err := os.Lstat(p); err != nil || fi.Mode().Type() != os.ModeSocket {
		return
	}
	c, err := net.DialTimeout("unix", p, time.Second)
	if err == nil {
		c.Close()
		return
	}
	if errors.Is(err, syscall.ECONNREFUSED) {
		os.Remove(p)
	}
}

// removeStale removes the admin sockets of earlier runs that nothing listens
// on any more (their workers were killed, which leaves the file), and leaves
// those still served: the workers of a fleet whose supervisor died may still
// be draining.
func (a adminSockets) removeStale() {
	names, _ := filepath.Glob(filepath.Join(a.dir, "worker-*.*.sock"))
	for _, p := range names {
		if !strings.HasSuffix(p, "."+a.run+".sock") {
			removeUnserved(p)
		}
	}
	a.removeDangling()
}

// removeDangling removes the stable names that lead nowhere: links of
// earlier runs to sockets their workers removed as they exited, or that
// removeStale removed, and those of a worker index this run does not have
// (a fleet started again with fewer workers). Such a name would fail as
// "no such file or directory" on a file ls shows. It also removes the
// temporary links of earlier runs that a killed supervisor left between
// point's two steps. The run directory's lock makes these names this
// run's to remove.
func (a adminSockets) removeDangling() {
	names, _ := filepath.Glob(filepath.Join(a.dir, "worker-*.sock"))
	tmps, _ := filepath.Glob(filepath.Join(a.dir, "worker-*.sock.*.tmp"))
	for _, p := range tmps {
		if !strings.HasSuffix(p, "."+a.run+".tmp") {
			names = append(names, p)
		}
	}
	for _, p := range names {
		if fi, err := os.Lstat(p); err != nil || fi.Mode().Type() != os.ModeSymlink {
			continue
		}
		if strings.HasSuffix(p, ".tmp") {
			os.Remove(p)
			continue
		}
		if _, err := os.Stat(p); errors.Is(err, fs.ErrNotExist) {
			os.Remove(p)
		}
	}
}
