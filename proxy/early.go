package proxy

import (
	"bytes"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/orbitproxy/orbit/internal/privdir"
	"github.com/orbitproxy/orbit/internal/sockdiag"
	"github.com/orbitproxy/orbit/orbitpool"
	"go.uber.org/zap"
)

// The connections a process closed early (see closedEarly) are known to the
// fleet through a file per process and key in the fleet's socket directory
// (mode 0700, the running user's): a unit such a connection gave back may go
// to a sibling's waiter, whose dial the upstream then refuses, and only a
// process that knows of the connection can tell that refusal from a failed
// request. Each line is "<unix nanoseconds> <local address> <remote
// address>"; the file is replaced whole. Files are named by process ID and
// lane, not lane alone: a process killed with connections closed early
// leaves its file for the fleet to read (its connections still count
// upstream) while another takes its lane; a file not written for
// maxRefusedHold, whose entries have all expired, is removed by whoever
// reads it.

// maxEarlyFile bounds what is read of a sibling's file.
const maxEarlyFile = 8 << 10

// earlyPrefix starts the name of every early-closed connections file.
const earlyPrefix = "early-"

// earlyFile is the path of this process's file for key, or "" for a pool
// without siblings.
func (n *Node) earlyFile(key orbitpool.Key) string {
	if n.sockDir == "" {
		return ""
	}
	return filepath.Join(n.sockDir, fmt.Sprintf("%s%d-%d-%s", earlyPrefix, os.Getpid(), n.pool.Lane(), key))
}

// writeEarly replaces this process's file for key with early, or removes it
// if early is empty.
func (n *Node) writeEarly(key orbitpool.Key, early []closedConn) {
	path := n.earlyFile(key)
	if path == "" {
		return
	}
	select {
	case <-n.stop:
		// Closed: Close removes the files once the last writer is done,
		// but a request's refusal check may still be under way.
		early = nil
	default:
	}
	if len(early) == 0 {
		if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
			n.log.Debug("removing the early-closed connections file", zap.String("path", path), zap.Error(err))
		}
		return
	}
	var b bytes.Buffer
	for _, e := range early {
		fmt.Fprintf(&b, "%d %s %s\n", e.at.UnixNano(), e.ends.Local, e.ends.Remote)
	}
	if err := privdir.WriteFile(path, b.Bytes()); err != nil {
		n.log.Debug("writing the early-closed connections file", zap.String("path", path), zap.Error(err))
	}
}

// readEarly returns the connections of key the fleet's other processes
// closed early, as their files say.
func (n *Node) readEarly(key orbitpool.Key) []closedConn {
	if n.sockDir == "" {
		return nil
	}
	ents, err := os.ReadDir(n.sockDir)
	if err != nil {
		return nil
	}
	own := filepath.Base(n.earlyFile(key))
	suffix := "-" + key.String()
	var all []closedConn
	for _, e := range ents {
		name := e.Name()
		if !e.Type().IsRegular() || !strings.HasPrefix(name, earlyPrefix) || !strings.HasSuffix(name, suffix) || name == own {
			continue
		}
		path := filepath.Join(n.sockDir, name)
		if info, err := e.Info(); err == nil && time.Since(info.ModTime()) > maxRefusedHold {
			os.Remove(path) // every entry in it has expired
			continue
		}
		all = append(all, parseEarly(readRegular(path, maxEarlyFile))...)
	}
	return all
}

// openRegular opens path (see privdir.OpenFile) without blocking, and only
// if it is a regular file by then: a FIFO's open or read would block, and
// the request or dial with it.
func openRegular(path string, flag int) (*os.File, os.FileInfo, error) {
	f, err := privdir.OpenFile(path, flag|syscall.O_NONBLOCK)
	if err != nil {
		return nil, nil, err
	}
	st, err := f.Stat()
	if err == nil && !st.Mode().IsRegular() {
		err = fmt.Errorf("%s is no regular file", path)
	}
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	return f, st, nil
}

// readRegular reads the end of the regular file at path (see openRegular),
// its last whole lines within limit bytes; nil if it cannot.
func readRegular(path string, limit int64) []byte {
	f, st, err := openRegular(path, os.O_RDONLY)
	if err != nil {
		return nil
	}
	defer f.Close()
	return tailLines(f, st.Size(), limit)
}

// tailLines reads the last whole lines within limit bytes of f, which
// holds size bytes.
func tailLines(f *os.File, size, limit int64) []byte {
	if size <= limit {
		b, _ := io.ReadAll(io.NewSectionReader(f, 0, limit))
		return b
	}
	// From the byte before the first one kept, through the line it ends.
	b, _ := io.ReadAll(io.NewSectionReader(f, size-limit-1, limit+1))
	if i := bytes.IndexByte(b, '\n'); i >= 0 {
		return b[i+1:]
	}
	return nil
}

// parseEarly reads the lines of an early-closed connections file, skipping
// any it cannot read whole, maxEarly at most.
func parseEarly(b []byte) []closedConn {
	var out []closedConn
	for line := range strings.Lines(string(b)) {
		if len(out) == maxEarly {
			break
		}
		f := strings.Fields(line)
		if len(f) != 3 || !strings.HasSuffix(line, "\n") {
			continue
		}
		at, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			continue
		}
		local, err := netip.ParseAddrPort(f[1])
		if err != nil {
			continue
		}
		remote, err := netip.ParseAddrPort(f[2])
		if err != nil {
			continue
		}
		out = append(out, closedConn{sockdiag.Conn{Local: local, Remote: remote}, time.Unix(0, at)})
	}
	return out
}

// removeEarlyFiles removes this process's early-closed connections files.
func (n *Node) removeEarlyFiles() {
	if n.sockDir == "" {
		return
	}
	files, _ := filepath.Glob(filepath.Join(n.sockDir, fmt.Sprintf("%s%d-%d-*", earlyPrefix, os.Getpid(), n.pool.Lane())))
	for _, f := range files {
		os.Remove(f)
	}
}
