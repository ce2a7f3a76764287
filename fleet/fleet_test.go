package fleet

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/internal/freeport"
)

func TestWorkerConfig(t *testing.T) {
	in := `{"admin": {"listen": "localhost:2019", "origins": ["a"]}, "apps": {"http": {}}}`
	out, err := workerConfig([]byte(in), "/run/f/worker-1.sock", nil)
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		Admin struct {
			Listen  string   `json:"listen"`
			Origins []string `json:"origins"`
			Config  struct {
				Persist *bool `json:"persist"`
			} `json:"config"`
		} `json:"admin"`
		Apps map[string]any `json:"apps"`
	}
	if err := json.Unmarshal(out, &cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.Admin.Listen != "unix//run/f/worker-1.sock" || cfg.Admin.Config.Persist == nil || *cfg.Admin.Config.Persist ||
		len(cfg.Admin.Origins) != 1 || cfg.Apps["http"] == nil {
		t.Errorf("worker config: %s", out)
	}
	if _, err := workerConfig([]byte(`{"admin": {"disabled": true}}`), "/s", nil); err == nil {
		t.Error("a config with the admin endpoint off was accepted")
	}
}

// TestHandoffListener: of two listeners on one socket in a process, only
// the newer accepts; the older resumes if the newer closes first, and the
// socket outlives both.
func TestHandoffListener(t *testing.T) {
	f, addr := listeningFile(t)
	defer f.Close()
	key := "test/" + addr
	open := func() *handoffListener {
		l, err := net.FileListener(f)
		if err != nil {
			t.Fatal(err)
		}
		return newHandoffListener(key, l.(*net.TCPListener))
	}
	accepted := func(l *handoffListener) <-chan net.Conn {
		ch := make(chan net.Conn, 1)
		go func() {
			c, err := l.Accept()
			if err == nil {
				ch <- c
			}
			close(ch)
		}()
		return ch
	}
	dial := func() net.Conn {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}

	old := open()
	oldCh := accepted(old)
	time.Sleep(20 * time.Millisecond) // old is in Accept
	newer := open()
	newCh := accepted(newer)
	c1 := dial()
	defer c1.Close()
	select {
	case c := <-newCh:
		c.Close()
	case <-oldCh:
		t.Fatal("the older listener accepted after a newer one opened")
	case <-time.After(3 * time.Second):
		t.Fatal("nobody accepted")
	}
	// The newer one closes first (its config failed to start): the older
	// takes over, on the same socket.
	newer.Close()
	c2 := dial()
	defer c2.Close()
	select {
	case c, ok := <-oldCh:
		if !ok {
			t.Fatal("the older listener failed")
		}
		c.Close()
	case <-time.After(3 * time.Second):
		t.Fatal("the older listener did not resume")
	}
	old.Close()
	if _, err := old.Accept(); err == nil {
		t.Error("a closed listener accepted")
	}
	// The socket is still open: a third listener accepts a new connection.
	third := open()
	defer third.Close()
	ch := accepted(third)
	c3 := dial()
	defer c3.Close()
	select {
	case c := <-ch:
		c.Close()
	case <-time.After(3 * time.Second):
		t.Fatal("the socket did not survive its listeners")
	}
}

func TestFleetSocketsRewrite(t *testing.T) {
	// A port free a moment ago, for the fleet to open.
	p, err := freeport.Pick()
	if err != nil {
		t.Fatal(err)
	}
	port := strconv.Itoa(p)
	cfg := `{"apps": {"http": {"servers": {"a": {"listen": ["127.0.0.1:` + port + `", "unix//tmp/x.sock", "{env.ADDR}"]}}}}}`
	fs, err := openFleetSockets([]byte(cfg), 2, false)
	if err != nil {
		t.Fatal(err)
	}
	defer fs.close()
	if len(fs.files) != 2 || len(fs.files[0]) != 1 || len(fs.files[1]) != 1 || fs.fds["tcp/127.0.0.1:"+port] != 3 {
		t.Fatalf("sockets %v, %v", fs.fds, fs.files)
	}
	if fs.files[0][0].Fd() == fs.files[1][0].Fd() {
		t.Fatal("the two slots share one socket")
	}
	out, err := workerConfig([]byte(cfg), "/run/w.sock", fs)
	if err != nil {
		t.Fatal(err)
	}
	want := `"listen":["orbittcp/127.0.0.1:` + port + `","unix//tmp/x.sock","{env.ADDR}"]`
	if !strings.Contains(string(out), want) || !strings.Contains(string(out), `"shutdown_delay":"1s"`) {
		t.Errorf("worker config %s\nwant %s and a shutdown delay", out, want)
	}
	if !strings.Contains(fs.env(), `"tcp/127.0.0.1:`+port+`":3`) {
		t.Errorf("env %s", fs.env())
	}
	out, _ = workerConfig([]byte(`{"apps": {"http": {"shutdown_delay": "5s"}}}`), "/run/w.sock", fs)
	if !strings.Contains(string(out), `"shutdown_delay":"5s"`) {
		t.Errorf("the configuration's shutdown_delay was replaced: %s", out)
	}
}

// TestFleetSocketsRefuseTakenAddress: an address another process listens on,
// with SO_REUSEPORT or without, is refused, unless the fleet is told to take
// over from it.
func TestFleetSocketsRefuseTakenAddress(t *testing.T) {
	for _, reuse := range []bool{false, true} {
		lc := net.ListenConfig{}
		if reuse {
			lc.Control = reusePortControl
		}
		other, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := strconv.Itoa(other.Addr().(*net.TCPAddr).Port)
		cfg := []byte(`{"apps": {"http": {"servers": {"a": {"listen": [":` + port + `"]}}}}}`)
		if fs, err := openFleetSockets(cfg, 2, false); err == nil || !strings.Contains(err.Error(), "--handover") {
			if fs != nil {
				fs.close()
			}
			t.Errorf("reuseport=%v: the address of a running listener was not refused: %v", reuse, err)
		}
		fs, err := openFleetSockets(cfg, 2, true)
		switch {
		case reuse && err != nil:
			t.Errorf("with --handover, beside a SO_REUSEPORT listener: %v", err)
		case reuse && (len(fs.taken) != 1 || fs.taken[0] != "tcp/:"+port):
			t.Errorf("with --handover, taken addresses %v", fs.taken)
		case !reuse && err == nil:
			t.Error("a listener without SO_REUSEPORT cannot be shared, yet the fleet opened its address")
		}
		if fs != nil {
			fs.close()
		}
		other.Close()
	}
}

// TestStopAcceptingServesTheQueue: a worker that stops accepting at exit
// serves the connections already queued on its socket instead of leaving
// them to be reset, and new connections are refused once the socket's last
// descriptor closes.
func TestStopAcceptingServesTheQueue(t *testing.T) {
	f, addr := listeningFile(t)
	fl, err := net.FileListener(f)
	if err != nil {
		t.Fatal(err)
	}
	key := "test-drain/" + addr
	l := newHandoffListener(key, fl.(*net.TCPListener))
	// Queued: the handshakes complete, nobody accepts yet.
	const queued = 5
	var clients []net.Conn
	for i := range queued {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprintf(c, "%d\n", i)
		clients = append(clients, c)
	}
	v, _ := socketGroups.Load(key)
	fd, err := dupFD(f)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	v.(*socketGroup).stopAccepting(fd)
	if c, err := net.Dial("tcp", addr); err == nil {
		c.Close()
		t.Fatal("a connection was accepted after the last descriptor closed")
	}
	// acceptSoon is l.Accept, bounded: with the queue lost, it would wait
	// for a connection that never comes.
	acceptSoon := func() (net.Conn, error) {
		type accepted struct {
			c   net.Conn
			err error
		}
		ch := make(chan accepted, 1)
		go func() {
			c, err := l.Accept()
			ch <- accepted{c, err}
		}()
		select {
		case a := <-ch:
			return a.c, a.err
		case <-time.After(3 * time.Second):
			return nil, errors.New("nothing to accept")
		}
	}
	seen := make(map[string]bool)
	for range queued {
		c, err := acceptSoon()
		if err != nil {
			t.Fatalf("accepting a queued connection: %v", err)
		}
		c.SetDeadline(time.Now().Add(5 * time.Second))
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil {
			t.Fatalf("reading a queued connection: %v", err)
		}
		seen[line] = true
		if _, err := c.Write([]byte("ok")); err != nil {
			t.Fatalf("answering a queued connection: %v", err)
		}
		c.Close()
	}
	if len(seen) != queued {
		t.Errorf("served %d distinct queued connections, want %d", len(seen), queued)
	}
	for _, c := range clients {
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if b, err := io.ReadAll(c); err != nil || string(b) != "ok" {
			t.Errorf("client read %q, %v; want the answer", b, err)
		}
	}
	// Nothing is left: Accept waits until the listener closes.
	errc := make(chan error, 1)
	go func() {
		c, err := l.Accept()
		if c != nil {
			c.Close()
		}
		errc <- err
	}()
	select {
	case err := <-errc:
		t.Fatalf("Accept returned %v with nothing queued", err)
	case <-time.After(50 * time.Millisecond):
	}
	if err := l.Close(); err != nil {
		t.Errorf("closing the listener: %v", err)
	}
	if err := <-errc; !errors.Is(err, net.ErrClosed) {
		t.Errorf("Accept after Close: %v, want net.ErrClosed", err)
	}
}

// listeningFile returns a descriptor of a listening socket on loopback, as
// a worker inherits one, and its address.
func listeningFile(t *testing.T) (*os.File, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	f, err := ln.(*net.TCPListener).File()
	if err != nil {
		t.Fatal(err)
	}
	return f, ln.Addr().String()
}
