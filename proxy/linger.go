package proxy

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/orbitproxy/orbit/internal/privdir"
	"github.com/orbitproxy/orbit/internal/sockdiag"
	"github.com/orbitproxy/orbit/orbitpool"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"
)

// maxRemotes bounds the upstream addresses a key remembers (see sawRemote):
// a name that resolves to many keeps its latest.
const maxRemotes = 8

// maxPublished bounds the addresses a key remembers having told the fleet
// (see publishRemote), beyond maxRemotes: a name that resolves to more
// addresses than a key remembers, dialed in turn, would otherwise have
// each told again at every dial.
const maxPublished = 256

// sawRemote records a, a literal address of the key's upstream or one a
// connection of the key is dialed to, for lingering, and reports whether the
// fleet has yet to be told of it. kc may be nil.
func (kc *keyCap) sawRemote(a netip.AddrPort) (tell bool) {
	if kc == nil || !a.IsValid() {
		return false
	}
	a = netip.AddrPortFrom(a.Addr().Unmap(), a.Port())
	kc.remoteMu.Lock()
	defer kc.remoteMu.Unlock()
	if !slices.Contains(kc.remotes, a) {
		if len(kc.remotes) == maxRemotes {
			kc.remotes = slices.Delete(kc.remotes, 0, 1)
		}
		kc.remotes = append(kc.remotes, a)
	}
	if kc.published[a] {
		return false
	}
	if len(kc.published) == maxPublished {
		clear(kc.published)
	}
	if kc.published == nil {
		kc.published = make(map[netip.AddrPort]bool)
	}
	kc.published[a] = true
	return true
}

// sawRemote records a for key (see keyCap.sawRemote) and, the first time
// this process sees it, tells the fleet (see publishRemote); again at the
// next dial if another member kept the file locked.
func (n *Node) sawRemote(key orbitpool.Key, kc *keyCap, a netip.AddrPort) {
	if kc.sawRemote(a) && errors.Is(n.publishRemote(key, a), errRemotesBusy) {
		kc.remoteMu.Lock()
		delete(kc.published, a)
		kc.remoteMu.Unlock()
	}
}

// A key's upstream addresses are known to the fleet through a file per key
// in the socket directory (mode 0700, the running user's), to which each
// process appends a line the first time it learns an address. The member
// that holds a dead process's share of a cap may have no request for the
// key yet, as a worker restarted in the dead one's place has none, and
// must still count the connections the dead one left with the upstream:
// without their address, the share went back on a set time while the
// upstream still counted them, and every dial into it was refused.
const remotesPrefix = "remotes-"

// maxRemotesFile bounds what is read of a key's addresses file: its end,
// where the newest addresses are.
const maxRemotesFile = 4 << 10

func (n *Node) remotesFile(key orbitpool.Key) string {
	return filepath.Join(n.sockDir, remotesPrefix+key.String())
}

// maxRemotesFileSize is the size past which an append rewrites a key's
// addresses file with what a reader takes from it (see rewriteRemotes):
// every process start tells the fleet its addresses again, so a fleet that
// lives through many restarts would otherwise grow the file without bound.
const maxRemotesFileSize = 4 * maxRemotesFile

// remotesLockWait bounds how long an append waits for another member's
// append or rewrite of the same file: it runs on a dial.
const remotesLockWait = 100 * time.Millisecond

// publishRemote appends a to key's addresses file (see appendRemote). A
// closed node writes nothing: the last member to leave removes the files.
func (n *Node) publishRemote(key orbitpool.Key, a netip.AddrPort) error {
	if n.sockDir == "" {
		return nil
	}
	select {
	case <-n.stop:
		return nil
	default:
	}
	err := appendRemote(n.remotesFile(key), a)
	switch {
	case errors.Is(err, errRemotesUnbounded):
		n.log.Warn("an upstream's addresses file could not be rewritten past its bound; appended to it",
			zap.Stringer("upstream", a), zap.Int("bound", maxRemotesFileSize), zap.Error(err))
		return nil
	case err != nil:
		n.log.Warn("telling the fleet an upstream's address; a dead process's share of its cap may be held for a set time only",
			zap.Stringer("upstream", a), zap.Error(err))
	}
	return err
}

// errRemotesBusy is an append's error when other members kept the
// addresses file locked, or replaced it, past remotesLockWait: the next
// dial tries again.
var errRemotesBusy = errors.New("addresses file busy")

// errRemotesUnbounded is an append's error when the file was past its
// bound and could not be rewritten: the address went to the file, which
// grows.
var errRemotesUnbounded = errors.New("addresses file not rewritten")

// appendRemote appends a to the addresses file at path (see openRegular),
// on a line of its own even if the last write to the file was cut short, or
// rewrites the file with it once it has grown past maxRemotesFileSize. Both
// hold the file's lock (flock): an append must not go to a file that a
// rewrite has read and is replacing, to be lost with it, so one that finds
// its file replaced by the time it has the lock opens the new one.
func appendRemote(path string, a netip.AddrPort) error {
	line := []byte("\n" + a.String() + "\n")
	deadline := time.Now().Add(remotesLockWait)
	for {
		f, _, err := openRegular(path, os.O_RDWR|os.O_APPEND|os.O_CREATE)
		if err != nil {
			return err
		}
		st, err := lockFile(f, deadline)
		if err == nil {
			if cur, lerr := os.Lstat(path); lerr != nil || !os.SameFile(cur, st) {
				f.Close()
				if time.Now().After(deadline) {
					return fmt.Errorf("%w: %s replaced under every append for %v", errRemotesBusy, path, remotesLockWait)
				}
				continue
			}
			full := st.Size()+int64(len(line)) > maxRemotesFileSize
			if full {
				err = rewriteRemotes(path, f, st.Size(), a)
			}
			if !full || err != nil {
				// A rewrite that failed (a directory that takes no
				// new file) leaves the file growing rather than the
				// address untold; its error says so.
				if _, werr := f.Write(line); werr != nil {
					err = werr
				}
			}
		}
		if cerr := f.Close(); err == nil { // the lock goes with it
			err = cerr
		}
		return err
	}
}

// lockFile takes f's exclusive lock, waiting until deadline at most, and
// returns f's state once it has it.
func lockFile(f *os.File, deadline time.Time) (os.FileInfo, error) {
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		switch {
		case err == nil:
			return f.Stat()
		case err != unix.EWOULDBLOCK && err != unix.EINTR:
			return nil, fmt.Errorf("locking %s: %w", f.Name(), err)
		case time.Now().After(deadline):
			return nil, fmt.Errorf("%w: %s locked by another process for over %v", errRemotesBusy, f.Name(), remotesLockWait)
		}
		time.Sleep(time.Millisecond)
	}
}

// rewriteRemotes replaces the addresses file at path, of which f (locked)
// holds size bytes, with the addresses a reader takes from it (see
// parseRemotes) and a: what a reader takes from the new file is what it
// would take from the old one with a appended.
func rewriteRemotes(path string, f *os.File, size int64, a netip.AddrPort) error {
	keep := parseRemotes(tailLines(f, size, maxRemotesFile))
	keep = slices.DeleteFunc(keep, func(k netip.AddrPort) bool { return k == a })
	var b []byte
	for _, k := range append(keep, a) {
		b = k.AppendTo(b)
		b = append(b, '\n')
	}
	if err := privdir.WriteFile(path, b); err != nil {
		return fmt.Errorf("%w: rewriting %s: %w", errRemotesUnbounded, path, err)
	}
	return nil
}

// fleetRemotes returns the addresses the fleet's processes have learned
// for key, as its addresses file says.
func (n *Node) fleetRemotes(key orbitpool.Key) []netip.AddrPort {
	if n.sockDir == "" {
		return nil
	}
	return parseRemotes(readRegular(n.remotesFile(key), maxRemotesFile))
}

// parseRemotes reads the lines of an addresses file, skipping any it cannot
// read whole, and returns the addresses last written, each once,
// maxFleetRemotes at most.
func parseRemotes(b []byte) []netip.AddrPort {
	var all []netip.AddrPort
	for line := range strings.Lines(string(b)) {
		text, whole := strings.CutSuffix(line, "\n")
		if a, err := netip.ParseAddrPort(text); whole && err == nil {
			all = append(all, a)
		}
	}
	var out []netip.AddrPort
	for i := len(all) - 1; i >= 0 && len(out) < maxFleetRemotes; i-- {
		if !slices.Contains(out, all[i]) {
			out = append(out, all[i])
		}
	}
	slices.Reverse(out)
	return out
}

// maxFleetRemotes bounds the addresses lingering asks the kernel about for
// a key: the fleet's, each process keeping maxRemotes.
const maxFleetRemotes = 4 * maxRemotes

// lingering counts the host's connections of key that their processes have
// closed, or died holding, and the upstream has not closed: it still counts
// them against any limit of its own, and a dead process's budget stays held
// for them (orbitpool.Pool.SetLingering). -1 if it cannot tell: the fleet
// knows no address of key's upstream, or the kernel does not say.
func (n *Node) lingering(key orbitpool.Key) int {
	var addrs []netip.AddrPort
	if kc := n.capOf(key); kc != nil {
		kc.remoteMu.Lock()
		addrs = slices.Clone(kc.remotes)
		kc.remoteMu.Unlock()
	}
	for _, a := range n.fleetRemotes(key) {
		if !slices.Contains(addrs, a) {
			addrs = append(addrs, a)
		}
	}
	if len(addrs) == 0 {
		return -1
	}
	c, err := sockdiag.Orphans(addrs)
	if err != nil {
		n.cannotCount(err)
		return -1
	}
	if c == 0 {
		return 0
	}
	v, _ := n.lingerLogAt.LoadOrStore(key, new(atomic.Int64))
	if logAt, now := v.(*atomic.Int64), sinceStart(time.Now()); now >= logAt.Load() {
		logAt.Store(now + int64(lingerLogEvery))
		n.log.Info("upstream still holds connections closed here; a dead process's share of the cap stays held",
			zap.Stringers("upstream", addrs), zap.Int("connections", c))
	}
	return c
}

// cannotCount logs, once, that the kernel will not say which connections an
// upstream still holds.
func (n *Node) cannotCount(err error) {
	n.lingerErr.Do(func() {
		n.log.Warn("cannot count the connections an upstream has not closed; a dead process's share of a cap is held for a set time only, and a refused connection is any failed one", zap.Error(err))
	})
}

// lingerLogEvery is how often lingering logs a key's connections still held
// open by its upstream, which it is asked about every 100ms while they are.
const lingerLogEvery = 10 * time.Second

// RemoveFleetFiles removes the files a fleet's processes wrote in its
// socket directory dir for one another (upstream addresses, connections
// closed early), for the last member to leave: a process killed leaves its
// own behind.
func RemoveFleetFiles(dir string) {
	for _, prefix := range []string{remotesPrefix, earlyPrefix} {
		files, _ := filepath.Glob(filepath.Join(dir, prefix+"*"))
		for _, f := range files {
			os.Remove(f)
		}
	}
}
