package fleet

import (
	"context"
	"io"
	"net"
	"os"
	"strconv"
	"testing"
	"time"
)

// TestAdv9LifeNoSocketOfItsOwnAfterExit: SIGTERM during a reload. A worker
// told to exit lets go of its inherited sockets (drainOnExit), and Caddy,
// stopping its configuration, holds its config lock for the shutdown delay
// and then serves a /load that was waiting for it, or the reload was
// already starting the new configuration's servers: either way a
// configuration may ask for its listeners after the worker let go of the
// sockets. It must not get a socket of its own on the address: the kernel
// would queue clients there, to be reset as the worker exits a moment
// later, when the fleet's stop refuses them instead.
func TestAdv9LifeNoSocketOfItsOwnAfterExit(t *testing.T) {
	f, addr := listeningFile(t)
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	port64, err := strconv.ParseUint(p, 10, 16)
	if err != nil {
		t.Fatal(err)
	}
	port := uint(port64)
	key := listenerKey("tcp", host, port)
	t.Cleanup(func() { socketGroups.Delete(key) })
	is := &inheritedSockets{files: map[string]*os.File{key: f}}
	ctx := context.Background()
	dialed := func() bool {
		c, err := net.DialTimeout("tcp", addr, 2*time.Second)
		if err != nil {
			return false
		}
		c.Close()
		return true
	}

	// The running configuration listens on the inherited socket.
	ln, err := is.listen(ctx, "tcp", host, port, net.ListenConfig{})
	if err != nil {
		t.Fatal(err)
	}
	l, ok := ln.(*handoffListener)
	if !ok {
		ln.(io.Closer).Close()
		t.Fatalf("the running configuration got %T, not the inherited socket", ln)
	}
	defer l.Close()
	if !dialed() {
		t.Fatal("no client could connect to the inherited socket")
	}

	is.exit() // SIGTERM
	if dialed() {
		t.Fatal("a client connected after the worker let go of its sockets")
	}

	// The reload's configuration comes now.
	late, err := is.listen(ctx, "tcp", host, port, net.ListenConfig{})
	if err == nil {
		defer late.(io.Closer).Close()
	}
	if dialed() {
		t.Fatalf("after the worker let go of its sockets, a configuration loaded late listens on %s with a socket of its own (%T): clients connect, to be reset as the worker exits", addr, late)
	}
	if err == nil {
		t.Errorf("a configuration loaded after the worker let go of its sockets got a listener on %s; want an error, so that the load fails", addr)
	}
}
