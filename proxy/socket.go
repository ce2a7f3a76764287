package proxy

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/orbitproxy/orbit/internal/privdir"
)

// maxSocketPath leaves room in sockaddr_un's 108 bytes for the file name.
const maxSocketPath = 100

// SocketDir is the directory holding the forwarding sockets of the fleet that
// shares the segment at segmentPath: the segment's path with ".sock" appended,
// or, when that would not fit in a unix socket address, a directory in the
// system temp directory named by a hash of the segment path. Every process
// derives the same directory, so none has to be told where its siblings are.
func SocketDir(segmentPath string) string {
	dir := segmentPath + ".sock"
	if len(SocketPath(dir, 255)) <= maxSocketPath {
		return dir
	}
	sum := sha256.Sum256([]byte(segmentPath))
	return filepath.Join(os.TempDir(), "orbit-"+hex.EncodeToString(sum[:8]))
}

// SocketPath is the forwarding socket of the process in lane.
func SocketPath(dir string, lane int) string {
	return filepath.Join(dir, fmt.Sprintf("lane-%d", lane))
}

// listenUnix listens on path with the directory 0700 and the socket 0600. A
// socket file left by a dead process is replaced; one a live process still
// answers on is an error, never stolen.
func listenUnix(path string) (*net.UnixListener, error) {
	// Another user who owns the directory could delete or replace the
	// sockets in it: use only a directory that is ours alone.
	if err := privdir.Ensure(filepath.Dir(path)); err != nil {
		return nil, fmt.Errorf("proxy: socket directory: %w", err)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("proxy: %s exists and is not a socket", path)
		}
		c, err := net.Dial("unix", path)
		if err == nil {
			c.Close()
			return nil, fmt.Errorf("proxy: %s is in use by a live process", path)
		}
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("proxy: removing stale socket: %w", err)
		}
	}
	// The directory is 0700, so the socket is private from its creation;
	// the chmod below narrows it further without touching the process-wide
	// umask.
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("proxy: listen: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("proxy: socket mode: %w", err)
	}
	return ln, nil
}

var errPeerUID = errors.New("proxy: peer runs as another user")

// checkPeer admits only a peer running as our own user: our upstream
// connections are our user's to share. The kernel vouches for the
// credentials (SO_PEERCRED), so nothing the peer sends can forge them. It
// returns the peer's process id, which the owner bounds its idle streams by.
func checkPeer(c *net.UnixConn) (pid int32, err error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := rc.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return 0, err
	}
	if cerr != nil {
		return 0, fmt.Errorf("proxy: SO_PEERCRED: %w", cerr)
	}
	if int(cred.Uid) != os.Getuid() {
		return 0, fmt.Errorf("%w: uid %d", errPeerUID, cred.Uid)
	}
	return cred.Pid, nil
}

// dialUnix connects to an owner's socket and checks that the owner is our
// user too.
func dialUnix(ctx context.Context, path string) (*net.UnixConn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, err
	}
	uc := c.(*net.UnixConn)
	if _, err := checkPeer(uc); err != nil {
		uc.Close()
		return nil, err
	}
	return uc, nil
}
