package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"net"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"golang.org/x/sys/unix"
)

// The workers of `caddy orbit-fleet` accept on listening sockets the
// supervisor opened and passed down: for every TCP address, one SO_REUSEPORT
// socket per worker slot, handed to that slot's worker and to every worker
// that replaces it. The kernel spreads new connections evenly over the
// sockets of a port, so clients spread evenly over the workers (one socket
// shared by all would go mostly to whichever worker is quickest back in
// accept). And since the supervisor holds every socket for its whole life,
// none closes when a worker reloads (Caddy opens a new listener for the new
// config and closes the old) or dies: connections queued on a dead worker's
// socket wait for its replacement instead of being reset, as they would be
// if each worker bound a socket of its own.
//
// The supervisor rewrites each HTTP server's TCP listen address to one of the
// networks below; a worker resolves it to the inherited socket named in
// ORBIT_FLEET_LISTENERS. HTTP/3 stays on a UDP socket each worker binds with
// SO_REUSEPORT (a shared UDP socket would scatter a QUIC connection's packets
// over the workers).
const fleetListenersEnv = "ORBIT_FLEET_LISTENERS"

// fleetNetworks maps a TCP network to the network naming its inherited
// socket, and fleetNetworksH3 that network to HTTP/3's.
var (
	fleetNetworks   = map[string]string{"tcp": "orbittcp", "tcp4": "orbittcp4", "tcp6": "orbittcp6"}
	fleetNetworksH3 = map[string]string{"orbittcp": "udp", "orbittcp4": "udp4", "orbittcp6": "udp6"}
)

func init() {
	for fleetNet, h3Net := range fleetNetworksH3 {
		caddy.RegisterNetwork(fleetNet, listenInherited)
		caddyhttp.RegisterNetworkHTTP3(fleetNet, h3Net)
	}
}

// listenerKey names one TCP socket: network/host:port.
func listenerKey(network, host string, port uint) string {
	return network + "/" + net.JoinHostPort(host, strconv.FormatUint(uint64(port), 10))
}

// inheritedSockets are the sockets this worker was started with, by
// listenerKey, until the last listener on one closes.
type inheritedSockets struct {
	mu    sync.Mutex
	files map[string]*os.File
	// exiting: the worker was told to exit and has let go of the
	// sockets (see exit).
	exiting bool
}

var inherited = sync.OnceValues(func() (*inheritedSockets, error) {
	is := &inheritedSockets{files: make(map[string]*os.File)}
	v := os.Getenv(fleetListenersEnv)
	if v == "" {
		return is, nil
	}
	var fds map[string]int
	if err := json.Unmarshal([]byte(v), &fds); err != nil {
		return nil, fmt.Errorf("%s: %w", fleetListenersEnv, err)
	}
	for key, fd := range fds {
		is.files[key] = os.NewFile(uintptr(fd), key)
	}
	if len(fds) > 0 {
		// Registered here, not in the goroutine: a signal that comes
		// before the goroutine runs is kept for it.
		sigs := make(chan os.Signal, 1)
		signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
		go is.drainOnExit(sigs)
	}
	return is, nil
})

// drainOnExit stops accepting once the worker is told to exit (SIGTERM, as
// the supervisor and Pdeathsig send it, or SIGINT; Caddy's own handler stops
// the servers). Caddy's servers go on accepting until their shutdown delay
// has passed, and at their shutdown the kernel resets every connection still
// queued on a socket that closes, and net/http drops unanswered every
// connection it accepted but had not yet read a request from. Stopping at
// the signal instead, with the queue taken in, leaves the shutdown delay to
// read and serve what was accepted; new connections are refused at once, as
// by a lone server that stops, or wait for this slot's replacement while the
// supervisor still holds the socket.
func (is *inheritedSockets) drainOnExit(sigs chan os.Signal) {
	<-sigs
	signal.Stop(sigs)
	is.exit()
}

// exit is drainOnExit's work once the signal came. From then on, the
// worker listens on no socket of the fleet's networks: a configuration
// loaded now (a reload that reached the worker with the signal, which Caddy
// runs once it has stopped the old one) fails to start rather than bind a
// socket of its own, where the kernel would queue clients that the worker,
// exiting, resets.
func (is *inheritedSockets) exit() {
	is.mu.Lock()
	is.exiting = true
	files := maps.Clone(is.files)
	is.mu.Unlock()
	for key, f := range files {
		// The socket's queue is taken in on a descriptor of its own, the
		// last one this process holds, so that closing it follows the
		// last accept call at once.
		fd, err := dupFD(f)
		is.release(key)
		if err != nil {
			continue // its listeners close with their servers
		}
		v, _ := socketGroups.LoadOrStore(key, &socketGroup{changed: make(chan struct{})})
		v.(*socketGroup).stopAccepting(fd)
	}
}

// listener returns a new listener on the inherited socket key, or nil if
// there is none (or no longer one); an error once the worker is exiting.
func (is *inheritedSockets) listener(key string) (*handoffListener, error) {
	is.mu.Lock()
	defer is.mu.Unlock()
	if is.exiting {
		return nil, fmt.Errorf("%s: the worker is exiting and has let go of its sockets; it listens on no socket of its own, whose clients it would reset as it exits", key)
	}
	f := is.files[key]
	if f == nil {
		return nil, nil
	}
	// A new descriptor for the same socket: closing it when this config
	// stops leaves the socket, and its queue, to the others.
	ln, err := net.FileListener(f)
	if err != nil {
		return nil, err
	}
	tl, ok := ln.(*net.TCPListener)
	if !ok {
		ln.Close()
		return nil, fmt.Errorf("%s: inherited descriptor is not a TCP listener", key)
	}
	return newHandoffListener(key, tl), nil
}

// release closes this worker's descriptor of the socket key, once no config
// listens on it: the worker is stopping (or its config no longer has the
// address). Held on, it would keep the socket listening after every server
// on it has gone, and connections queued there would wait for an accept
// that never comes, then be reset; closed, as a lone server's listener is,
// new connections are refused once the fleet has stopped. The supervisor
// still holds the socket while the fleet runs, so a worker that stops alone
// leaves its queue to its replacement.
func (is *inheritedSockets) release(key string) {
	is.mu.Lock()
	defer is.mu.Unlock()
	if f := is.files[key]; f != nil {
		f.Close()
		delete(is.files, key)
	}
}

// listenInherited returns a listener on the inherited socket for the
// address, or, for an address the supervisor opened no socket for (one a
// reload added, or a process not started by orbit-fleet), a listener of its
// own as Caddy would make it; neither once the worker is exiting (see
// inheritedSockets.exit).
func listenInherited(ctx context.Context, network, host, portRange string, portOffset uint, cfg net.ListenConfig) (any, error) {
	tcpNet := strings.TrimPrefix(network, "orbit")
	start, _, err := parsePortRange(portRange)
	if err != nil {
		return nil, fmt.Errorf("%s/%s:%s: %w", network, host, portRange, err)
	}
	port := start + portOffset
	is, err := inherited()
	if err != nil {
		return nil, err
	}
	return is.listen(ctx, tcpNet, host, port, cfg)
}

// listen is listenInherited with this process's inherited sockets, for TCP
// network tcpNet.
func (is *inheritedSockets) listen(ctx context.Context, tcpNet, host string, port uint, cfg net.ListenConfig) (any, error) {
	key := listenerKey(tcpNet, host, port)
	if l, err := is.listener(key); l != nil || err != nil {
		return l, err
	}
	na := caddy.NetworkAddress{Network: tcpNet, Host: host, StartPort: port, EndPort: port}
	return na.Listen(ctx, 0, cfg)
}

// socketGroups are this process's open listeners on each inherited
// socket, oldest first: during a config reload the old config's server and
// the new one's both have one.
var socketGroups sync.Map // listenerKey -> *socketGroup

type socketGroup struct {
	mu      sync.Mutex
	lns     []*handoffListener
	changed chan struct{} // closed when lns changes
	// handed are connections an older listener accepted in the instant a
	// newer one took over (its accept call was already under way), and
	// those left queued on the socket when the process stopped accepting;
	// the newest listener serves them.
	handed []net.Conn
	// draining: the process is exiting, and accepts no more from the
	// socket.
	draining bool
	// accepting counts the listeners in an accept call on the socket.
	accepting int
}

// stopAccepting closes the listeners' descriptors of the socket, takes in
// the connections queued on it, for the newest listener to serve, and closes
// fd, its last descriptor in this process, at once: a connection whose
// handshake completes in between is reset. The listeners stay open, serving
// what they were handed, until their servers close them.
func (g *socketGroup) stopAccepting(fd int) {
	g.mu.Lock()
	g.draining = true
	for _, l := range g.lns {
		l.TCPListener.SetDeadline(time.Now()) // interrupt its Accept
	}
	// A descriptor closed under a blocked accept call is released only
	// when that call returns: until then the socket would go on queueing
	// connections, to reset them when it finally closes.
	for g.accepting > 0 {
		ch := g.changed
		g.mu.Unlock()
		<-ch
		g.mu.Lock()
	}
	for _, l := range g.lns {
		l.TCPListener.Close()
	}
	g.mu.Unlock()
	queued := acceptQueuedAndClose(fd)
	g.mu.Lock()
	g.handed = append(g.handed, queued...)
	g.notifyLocked()
	g.mu.Unlock()
}

// dupFD returns a new descriptor, close-on-exec, of f's.
func dupFD(f *os.File) (int, error) {
	rc, err := f.SyscallConn()
	if err != nil {
		return -1, err
	}
	fd := -1
	if cerr := rc.Control(func(old uintptr) { fd, err = unix.FcntlInt(old, unix.F_DUPFD_CLOEXEC, 0) }); cerr != nil {
		return -1, cerr
	}
	return fd, err
}

// acceptQueuedAndClose accepts, without waiting, every connection queued on
// the listening socket fd, then closes fd.
func acceptQueuedAndClose(fd int) []net.Conn {
	var conns []net.Conn
	if err := unix.SetNonblock(fd, true); err == nil {
		for {
			nfd, _, err := unix.Accept4(fd, unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC)
			if err == unix.EINTR || err == unix.ECONNABORTED {
				continue
			}
			if err != nil {
				break // EAGAIN: the queue is empty
			}
			cf := os.NewFile(uintptr(nfd), "accepted")
			c, err := net.FileConn(cf)
			cf.Close()
			if err == nil {
				conns = append(conns, c)
			}
		}
	}
	unix.Close(fd)
	return conns
}

// handoffListener hands a socket over from one config to the next: once a
// newer listener on the same socket exists in this process, it stops
// accepting, and resumes only if the newer one closes first (a new config
// that failed to start). Without the hand-over, the old config's server would
// go on accepting until it shuts down, and net/http drops the request of a
// connection whose server began shutting down before the request was read:
// a client would see the connection closed with no response.
type handoffListener struct {
	*net.TCPListener
	key    string
	g      *socketGroup
	closed bool // under g.mu
}

func newHandoffListener(key string, tl *net.TCPListener) *handoffListener {
	v, _ := socketGroups.LoadOrStore(key, &socketGroup{changed: make(chan struct{})})
	g := v.(*socketGroup)
	l := &handoffListener{TCPListener: tl, key: key, g: g}
	g.mu.Lock()
	for _, old := range g.lns {
		old.TCPListener.SetDeadline(time.Now()) // interrupt its Accept
	}
	g.lns = append(g.lns, l)
	g.notifyLocked()
	g.mu.Unlock()
	return l
}

func (g *socketGroup) notifyLocked() {
	close(g.changed)
	g.changed = make(chan struct{})
}

// Accept accepts while l is the newest listener on its socket.
func (l *handoffListener) Accept() (net.Conn, error) {
	g := l.g
	for {
		g.mu.Lock()
		if l.closed {
			g.mu.Unlock()
			return nil, net.ErrClosed
		}
		newest := g.lns[len(g.lns)-1] == l
		if newest && len(g.handed) > 0 {
			c := g.handed[0]
			g.handed = g.handed[1:]
			g.mu.Unlock()
			return c, nil
		}
		if !newest || g.draining {
			ch := g.changed
			g.mu.Unlock()
			<-ch
			continue
		}
		// Under g.mu, so that a newer listener's interruption cannot
		// come between this and the Accept below unnoticed.
		l.TCPListener.SetDeadline(time.Time{})
		g.accepting++
		g.mu.Unlock()
		c, err := l.TCPListener.Accept()
		g.mu.Lock()
		g.accepting--
		if g.draining {
			g.notifyLocked()
		}
		if err != nil {
			stopped := g.draining
			g.mu.Unlock()
			if ne, ok := err.(net.Error); stopped || ok && ne.Timeout() {
				continue
			}
			return nil, err
		}
		if n := len(g.lns); n > 0 && g.lns[n-1] != l {
			// The accept call was under way when a newer listener took
			// over, or this one closed: the connection is the newest
			// one's to serve.
			g.handed = append(g.handed, c)
			g.lns[n-1].TCPListener.SetDeadline(time.Now()) // interrupt its Accept
			g.notifyLocked()
			g.mu.Unlock()
			continue
		}
		g.mu.Unlock()
		return c, nil
	}
}

// Close closes this descriptor of the socket; the socket stays open.
func (l *handoffListener) Close() error {
	g := l.g
	g.mu.Lock()
	if !l.closed {
		l.closed = true
		for i, x := range g.lns {
			if x == l {
				g.lns = append(g.lns[:i], g.lns[i+1:]...)
				break
			}
		}
		last := len(g.lns) == 0
		if last {
			for _, c := range g.handed {
				c.Close()
			}
			g.handed = nil
		}
		g.notifyLocked()
		drained := g.draining
		g.mu.Unlock()
		err := l.TCPListener.Close()
		if drained {
			err = nil // closed when the process stopped accepting
		}
		if last {
			if is, _ := inherited(); is != nil {
				is.release(l.key)
			}
		}
		return err
	}
	g.mu.Unlock()
	return l.TCPListener.Close()
}

// reusePortControl sets SO_REUSEPORT, as Caddy does on its own listeners.
func reusePortControl(_, _ string, c syscall.RawConn) error {
	var serr error
	err := c.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
	})
	if err != nil {
		return err
	}
	return serr
}

func parsePortRange(r string) (start, end uint, err error) {
	lo, hi, isRange := strings.Cut(r, "-")
	s, err := strconv.ParseUint(lo, 10, 16)
	if err != nil {
		return 0, 0, fmt.Errorf("bad port %q", r)
	}
	e := s
	if isRange {
		if e, err = strconv.ParseUint(hi, 10, 16); err != nil || e < s {
			return 0, 0, fmt.Errorf("bad port range %q", r)
		}
	}
	return uint(s), uint(e), nil
}

// fleetSockets are the listening sockets a supervisor holds for its worker
// slots.
type fleetSockets struct {
	files [][]*os.File   // per worker slot, passed as descriptors 3, 4, ...
	fds   map[string]int // listenerKey -> descriptor in every worker
	taken []string       // listenerKeys another process was listening on
	// unclaimed are listenerKeys opened without claimAddress's lock,
	// which something held too long.
	unclaimed []string
}

// claimAddressWait bounds how long claimAddress waits for another fleet to
// open an address.
const claimAddressWait = 2 * time.Second

// claimAddress takes, for a moment, a host-wide lock on opening the TCP
// address key: an abstract unix socket named after it (in the network
// namespace, as the address is), which the kernel releases if this process
// dies. ok is false if it stayed taken for claimAddressWait: another user
// may bind the name, and must not be able to keep the fleet from starting
// by holding it.
func claimAddress(key string) (release func(), ok bool) {
	name := "@orbit-fleet/" + key
	if len(name) > 100 {
		h := fnv.New64a()
		h.Write([]byte(key))
		name = fmt.Sprintf("@orbit-fleet/%x", h.Sum64())
	}
	deadline := time.Now().Add(claimAddressWait)
	for {
		ln, err := net.Listen("unix", name)
		if err == nil {
			return func() { ln.Close() }, true
		}
		if !errors.Is(err, unix.EADDRINUSE) || time.Now().After(deadline) {
			return nil, false
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// openFleetSockets opens, for every TCP address the HTTP servers of config
// listen on, one listening socket per worker slot. The sockets have
// SO_REUSEPORT set: the slots of one address share its connections, and a
// new fleet can start on the same ports before the old one stops.
//
// SO_REUSEPORT would as readily let a second fleet (or any server of this
// user) listen beside one already running, and the kernel would silently
// split the clients between them. So an address another process listens on
// is refused, unless handover says this fleet is meant to take over from it.
func openFleetSockets(config []byte, slots int, handover bool) (*fleetSockets, error) {
	fs := &fleetSockets{fds: make(map[string]int), files: make([][]*os.File, slots)}
	addrs, err := tcpListenAddrs(config)
	if err != nil {
		return nil, err
	}
	lc := net.ListenConfig{Control: reusePortControl}
	for _, na := range addrs {
		for p := na.StartPort; p <= na.EndPort; p++ {
			key := listenerKey(na.Network, na.Host, p)
			if _, ok := fs.fds[key]; ok {
				continue
			}
			// Held until every address is open: a fleet opening the
			// same address at the same moment finds it taken, instead
			// of both finding it free and both opening it.
			if release, ok := claimAddress(key); ok {
				defer release()
			} else {
				fs.unclaimed = append(fs.unclaimed, key)
			}
			addr := net.JoinHostPort(na.Host, strconv.FormatUint(uint64(p), 10))
			if taken, err := listenedOn(na.Network, addr); err != nil {
				fs.close()
				return nil, fmt.Errorf("listening on %s: %w", key, err)
			} else if taken {
				if !handover {
					fs.close()
					return nil, fmt.Errorf("another process is listening on %s (another fleet, or another server): stop it first, or pass --handover to start this fleet beside it and take its place", key)
				}
				fs.taken = append(fs.taken, key)
			}
			fs.fds[key] = 3 + len(fs.files[0])
			for slot := range fs.files {
				ln, err := lc.Listen(context.Background(), na.Network, addr)
				if err != nil {
					fs.close()
					return nil, fmt.Errorf("listening on %s: %w", key, err)
				}
				f, err := ln.(*net.TCPListener).File()
				ln.Close()
				if err != nil {
					fs.close()
					return nil, fmt.Errorf("listening on %s: %w", key, err)
				}
				fs.files[slot] = append(fs.files[slot], f)
			}
		}
	}
	return fs, nil
}

// listenedOn reports whether some process listens on addr. A bind without
// SO_REUSEPORT fails while any socket listens on the address, whether or not
// that one set SO_REUSEPORT.
func listenedOn(network, addr string) (bool, error) {
	ln, err := net.Listen(network, addr)
	if err == nil {
		ln.Close()
		return false, nil
	}
	if errors.Is(err, unix.EADDRINUSE) {
		return true, nil
	}
	return false, err
}

// close closes the sockets; it may be called more than once.
func (fs *fleetSockets) close() {
	for _, files := range fs.files {
		for _, f := range files {
			if f != nil {
				f.Close()
			}
		}
	}
	fs.files = nil
}

// dropUnused closes the sockets of the addresses config no longer listens
// on, and returns their keys. The workers let go of theirs when their last
// server on one closes; held by the supervisor, the socket would go on
// queueing connections that no worker accepts. A later configuration that
// listens there again is bound by each worker, as any new address is.
// Their slots' descriptors are left closed in the workers started from now
// on.
func (fs *fleetSockets) dropUnused(config []byte) []string {
	addrs, err := tcpListenAddrs(config)
	if err != nil {
		return nil
	}
	want := make(map[string]bool)
	for _, na := range addrs {
		for p := na.StartPort; p <= na.EndPort; p++ {
			want[listenerKey(na.Network, na.Host, p)] = true
		}
	}
	var dropped []string
	for key, fd := range fs.fds {
		if want[key] {
			continue
		}
		for _, files := range fs.files {
			if i := fd - 3; i < len(files) && files[i] != nil {
				files[i].Close()
				files[i] = nil
			}
		}
		delete(fs.fds, key)
		dropped = append(dropped, key)
	}
	slices.Sort(dropped)
	return dropped
}

// env is the environment variable telling a worker which descriptor holds
// which socket.
func (fs *fleetSockets) env() string {
	b, _ := json.Marshal(fs.fds) // map[string]int: cannot fail
	return fleetListenersEnv + "=" + string(b)
}

// rewrite points every listen address of cfg's HTTP servers that has shared
// sockets at them; other addresses are left for the worker to bind.
func (fs *fleetSockets) rewrite(cfg map[string]any) {
	servers := httpServers(cfg)
	for _, srv := range servers {
		list, _ := srv["listen"].([]any)
		for i, v := range list {
			s, _ := v.(string)
			na, ok := tcpAddr(s)
			if !ok {
				continue
			}
			all := true
			for p := na.StartPort; p <= na.EndPort; p++ {
				if _, ok := fs.fds[listenerKey(na.Network, na.Host, p)]; !ok {
					all = false
				}
			}
			if all {
				ports := strconv.FormatUint(uint64(na.StartPort), 10)
				if na.EndPort != na.StartPort {
					ports += "-" + strconv.FormatUint(uint64(na.EndPort), 10)
				}
				list[i] = fleetNetworks[na.Network] + "/" + net.JoinHostPort(na.Host, ports)
			}
		}
	}
}

// tcpListenAddrs lists the TCP listen addresses of config's HTTP servers.
func tcpListenAddrs(config []byte) ([]caddy.NetworkAddress, error) {
	var cfg map[string]any
	if err := json.Unmarshal(config, &cfg); err != nil {
		return nil, fmt.Errorf("decoding configuration: %w", err)
	}
	var out []caddy.NetworkAddress
	for _, srv := range httpServers(cfg) {
		list, _ := srv["listen"].([]any)
		for _, v := range list {
			s, _ := v.(string)
			if na, ok := tcpAddr(s); ok {
				out = append(out, na)
			}
		}
	}
	return out, nil
}

// tcpAddr parses a listen address that names TCP ports, without
// placeholders.
func tcpAddr(s string) (caddy.NetworkAddress, bool) {
	if s == "" || strings.Contains(s, "{") {
		return caddy.NetworkAddress{}, false
	}
	na, err := caddy.ParseNetworkAddressWithDefaults(s, "tcp", 0)
	if err != nil || fleetNetworks[na.Network] == "" || na.StartPort == 0 {
		return caddy.NetworkAddress{}, false
	}
	return na, true
}

func httpServers(cfg map[string]any) []map[string]any {
	apps, _ := cfg["apps"].(map[string]any)
	httpApp, _ := apps["http"].(map[string]any)
	servers, _ := httpApp["servers"].(map[string]any)
	var out []map[string]any
	for _, v := range servers {
		if srv, ok := v.(map[string]any); ok {
			out = append(out, srv)
		}
	}
	return out
}
