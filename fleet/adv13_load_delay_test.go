package fleet

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	_ "github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
)

// TestAdv13LoadWaitsOutShutdownDelay: Caddy answers a /load only once the
// old configuration's apps have stopped, and the HTTP app's stop sleeps
// through its shutdown_delay when one of its listeners closes (a reload that
// drops or moves an address). A load that takes that long is healthy: the
// worker runs the new configuration. The supervisor's load timeout must not
// count it as a refusal ("every worker refused the new configuration"),
// which leaves the fleet's configuration the old one while the workers run
// the new. The worker here is Caddy itself, in this process, with its admin
// endpoint on a unix socket; loadTimeout stands for the minute of
// workerLoadTimeout, and the shutdown_delay is twice it.
func TestAdv13LoadWaitsOutShutdownDelay(t *testing.T) {
	sock := adminSockPath(t)
	const delay = "600ms"
	cfg := func(addr string) []byte { return serverConfig(addr, delay) }
	s := &supervisor{
		config:      cfg("127.0.0.1:0"),
		cfgGen:      1,
		events:      make(chan event, 4),
		log:         zap.NewNop(),
		loadTimeout: 300 * time.Millisecond,
	}
	w := &worker{id: 0, gen: 1, sock: sock, cfgGen: 1}
	runCaddyHere(t, s.config, sock)

	start := time.Now()
	s.push(cfg("127.0.0.2:0"), 2, []*worker{w}) // the old listener closes
	select {
	case ev := <-s.events:
		if ev.kind != evReloaded || len(ev.loads) != 1 {
			t.Fatalf("event %+v; want the reload's outcome", ev)
		}
		if err := ev.loads[0].err; err != nil {
			t.Errorf("the load, which Caddy applied after its %s shutdown_delay, counted as refused after %v: %v", delay, time.Since(start).Round(time.Millisecond), err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no outcome of the reload within 10s")
	}
}

// adminSockPath is a path for a worker's admin socket, in a directory of
// its own under /tmp (a unix socket path must be short), removed at the end.
func adminSockPath(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("/tmp", "fleetadmin")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return filepath.Join(dir, "admin.sock")
}

// serverConfig is a configuration whose one HTTP server listens on addr and
// sets shutdown_delay.
func serverConfig(addr, shutdownDelay string) []byte {
	return []byte(`{"apps":{"http":{"shutdown_delay":"` + shutdownDelay + `","servers":{"s":{"listen":["` + addr + `"]}}}}}`)
}

// runCaddyHere runs cfg, as a worker would, in this process's Caddy, its
// admin endpoint on the unix socket sock, until the test ends.
func runCaddyHere(t *testing.T, cfg []byte, sock string) {
	t.Helper()
	body, err := workerConfig(cfg, sock, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := caddy.Load(body, true); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { caddy.Stop() })
}
