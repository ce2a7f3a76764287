package caddymodule

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"
)

// adv30 tests: the fleet's lifecycle (reloads, stops, kills) under a mixed
// load.

// adv30Upstream answers GET /stream with a body streamed over 1.5 s, POST
// /post with the length of the body it read, and anything else with "ok"
// after 50 ms.
func adv30Upstream(t *testing.T) *upstream {
	return newUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/stream":
			fl := w.(http.Flusher)
			for i := range 10 {
				fmt.Fprintf(w, "chunk %02d\n", i)
				fl.Flush()
				time.Sleep(150 * time.Millisecond)
			}
		case "/post":
			n, err := io.Copy(io.Discard, r.Body)
			if err != nil {
				http.Error(w, err.Error(), 400)
				return
			}
			fmt.Fprintf(w, "%d", n)
		default:
			time.Sleep(50 * time.Millisecond)
			io.WriteString(w, "ok")
		}
	}), false)
}

const adv30StreamBody = "chunk 00\nchunk 01\nchunk 02\nchunk 03\nchunk 04\nchunk 05\nchunk 06\nchunk 07\nchunk 08\nchunk 09\n"

const adv30PostSize = 256 << 10

// adv30Tally counts, by kind of request, those answered as they should
// have been and those that failed.
type adv30Tally struct {
	mu     sync.Mutex
	ok     map[string]int
	failed map[string]int
	first  map[string]string
}

func (ta *adv30Tally) add(kind string, err error) {
	ta.mu.Lock()
	defer ta.mu.Unlock()
	if err == nil {
		ta.ok[kind]++
		return
	}
	if ta.failed[kind] == 0 {
		ta.first[kind] = time.Now().Format("15:04:05.000") + " " + err.Error()
	}
	ta.failed[kind]++
}

func (ta *adv30Tally) String() string {
	ta.mu.Lock()
	defer ta.mu.Unlock()
	return fmt.Sprintf("ok %v failed %v first %v", ta.ok, ta.failed, ta.first)
}

// adv30Load sends a mixed load to base until stop is closed: per kind
// (get, post, stream), conc clients, each request on a fresh connection.
// A client that could not connect is not counted: both stock and the fleet
// refuse connections once they stop listening.
func adv30Load(base string, conc int, stop <-chan struct{}) (*adv30Tally, <-chan struct{}) {
	ta := &adv30Tally{ok: map[string]int{}, failed: map[string]int{}, first: map[string]string{}}
	c := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	body := bytes.Repeat([]byte("x"), adv30PostSize)
	one := func(kind string) error {
		var req *http.Request
		switch kind {
		case "post":
			req, _ = http.NewRequest("POST", base+"/post", bytes.NewReader(body))
		case "stream":
			req, _ = http.NewRequest("GET", base+"/stream", nil)
		default:
			req, _ = http.NewRequest("GET", base+"/", nil)
		}
		resp, err := c.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			return fmt.Errorf("status %d, body cut after %d bytes: %w", resp.StatusCode, len(b), err)
		}
		want := map[string]string{"post": strconv.Itoa(adv30PostSize), "stream": adv30StreamBody, "get": "ok"}[kind]
		if resp.StatusCode != 200 || string(b) != want {
			return fmt.Errorf("status %d body %.60q", resp.StatusCode, b)
		}
		return nil
	}
	var wg sync.WaitGroup
	for _, kind := range []string{"get", "post", "stream"} {
		for range conc {
			wg.Go(func() {
				for {
					select {
					case <-stop:
						return
					default:
					}
					err := one(kind)
					if oe := (*net.OpError)(nil); err != nil && adv30IsDial(err, &oe) {
						time.Sleep(10 * time.Millisecond)
						continue
					}
					ta.add(kind, err)
				}
			})
		}
	}
	done := make(chan struct{})
	go func() {
		<-stop
		wg.Wait()
		close(done)
	}()
	return ta, done
}

func adv30IsDial(err error, oe **net.OpError) bool {
	for e := err; e != nil; {
		if o, ok := e.(*net.OpError); ok && o.Op == "dial" {
			*oe = o
			return true
		}
		u, ok := e.(interface{ Unwrap() error })
		if !ok {
			return false
		}
		e = u.Unwrap()
	}
	return false
}

// adv30Write writes the fleet's Caddyfile with the cap and version.
func (f *testFleet) adv30Write(up string, cap int, version string) {
	f.t.Helper()
	cfg := f.globals(fmt.Sprintf("max_conns_per_host %d\n\t\twait_timeout 10s\n\t\treconcile_interval %s\n\t\tworkers %d",
		cap, f.reconcile, f.govWorkers)) + fmt.Sprintf(`:%d {
	bind 127.0.0.1
	header X-Worker {env.ORBIT_FLEET_WORKER}
	header X-Config %s
	reverse_proxy %s {
		transport orbit_pool
	}
}
`, f.port, version, up)
	if err := os.WriteFile(f.caddyfile, []byte(cfg), 0o644); err != nil {
		f.t.Fatal(err)
	}
}

// adv30Run loads base with the mixed load, calls event after a second, and
// returns the tally once the load has run settle more after it.
func adv30Run(t *testing.T, base string, event func() error, settle time.Duration) *adv30Tally {
	t.Helper()
	stop := make(chan struct{})
	ta, done := adv30Load(base, 3, stop)
	time.Sleep(time.Second)
	err := event()
	time.Sleep(settle)
	close(stop)
	<-done
	if err != nil {
		t.Fatalf("event: %v", err)
	}
	return ta
}

// TestAdv30RefusedReloadUnderLoad: a reload to a segment that is a symlink
// (planted by the same user) is refused by every worker, which open the
// segment without following it; under the mixed load, the refused reload
// fails no request, as a refused `caddy reload` of stock Caddy fails none.
//
// It fails: the orbit_pool app joins the fleet in Start, and Caddy starts a
// config's apps in map order, so in about half the reloads the new config's
// HTTP server has started, and taken over the worker's sockets, before
// orbit_pool's Start fails. Until Caddy aborts the config, that server
// accepts clients and its orbit_pool transport answers each 502 ("opening
// segment ...: too many levels of symbolic links"). Any refusal of the
// membership at Start (a socket directory of the wrong mode or owner, a
// segment of another layout) does the same.
func TestAdv30RefusedReloadUnderLoad(t *testing.T) {
	up := adv30Upstream(t)
	f := newTestFleet(t, 2)
	f.reconcile = "50ms"
	f.adv30Write(up.hostport(), 2, "v1")
	f.launch()
	f.adv7WaitReady()
	target := filepath.Join(f.dir, "target")
	os.WriteFile(target, []byte("not a segment"), 0o600)
	link := filepath.Join(f.dir, "link.seg")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	adv30RefusedReload(t, f, up, func() {
		f.segment = link
		f.adv30Write(up.hostport(), 2, "v2")
	})
	if b, _ := os.ReadFile(target); string(b) != "not a segment" {
		t.Errorf("the symlink's target was written: %q", b)
	}
}

// TestAdv30RefusedLayoutReloadUnderLoad: as TestAdv30RefusedReloadUnderLoad,
// for a reload that sizes the table anew (keys 512) on the segment the fleet
// uses, which every worker refuses at orbit_pool's Start: the segment is laid
// out otherwise. It fails alike.
func TestAdv30RefusedLayoutReloadUnderLoad(t *testing.T) {
	up := adv30Upstream(t)
	f := newTestFleet(t, 2)
	f.reconcile = "50ms"
	f.adv30Write(up.hostport(), 2, "v1")
	f.launch()
	f.adv7WaitReady()
	adv30RefusedReload(t, f, up, func() {
		f.reconcile = "50ms\n\t\tkeys 512"
		f.adv30Write(up.hostport(), 2, "v2")
	})
}

// adv30RefusedReload reloads f with what write writes, which every worker
// refuses, under the mixed load, up to 5 times until a request fails; it
// fails t if one did.
func adv30RefusedReload(t *testing.T, f *testFleet, up *upstream, write func()) {
	t.Helper()
	// Caddy starts a config's apps in map order: the new config's HTTP
	// server accepts first in about half the reloads of each worker.
	var o *adv30Tally
	for range 5 {
		o = adv30Run(t, f.url(""), func() error {
			write()
			return f.cmd.Process.Signal(syscall.SIGHUP)
		}, 2*time.Second)
		t.Logf("refused reload: %v", o)
		if len(o.failed) > 0 {
			break
		}
	}
	// Well past the grace period, the fleet serves as before the reload.
	time.Sleep(2 * time.Second)
	var late []result
	for range 20 {
		if r := adv7Get(f.url("/"), 5*time.Second); r.err != nil || r.status != 200 {
			late = append(late, r)
		}
	}
	if len(late) > 0 {
		t.Errorf("%d of 20 requests failed 2 s after the refused reload, first: %v", len(late), late[0])
	}
	if n := f.adv7CountLog("every worker refused"); n == 0 {
		t.Errorf("the fleet's log does not say every worker refused the reload")
	}
	for _, kind := range []string{"get", "post", "stream"} {
		if o.failed[kind] > 0 {
			t.Errorf("%d %s requests failed across a refused reload; first: %s", o.failed[kind], kind, o.first[kind])
		}
	}
}

// TestAdv30RestartAfterSupervisorKilled: the supervisor is killed while its
// workers serve 1.5 s streams, and a new fleet is started at once in the
// same run directory, on the same port and segment (as systemd's
// Restart=always does). Once the old workers have drained and exited, the
// new fleet's workers are all reachable on their admin sockets and a
// reload reaches every one of them.
//
// It fails: every incarnation of worker N listens on run/worker-N.sock, and
// an old worker, exiting after its drain, closes its admin listener, which
// unlinks the path: the new worker's socket. The new fleet serves on, but
// the supervisor can no longer reach its workers: every reload (and
// catch-up) is "refused" with "connect: no such file or directory", and the
// admin API and metrics of each worker are gone, until each is restarted.
func TestAdv30RestartAfterSupervisorKilled(t *testing.T) {
	up := adv30Upstream(t)
	f := newTestFleet(t, 2)
	f.reconcile = "50ms"
	f.adv30Write(up.hostport(), 2, "v1")
	f.launch()
	f.adv7WaitReady()
	old := []int{f.workerPID(0), f.workerPID(1)}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				resp, err := http.Get(f.url("/stream"))
				if err != nil {
					time.Sleep(10 * time.Millisecond)
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
	time.Sleep(700 * time.Millisecond)
	if err := f.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	f.cmd.Wait()
	close(stop)
	g := f.adv7Relaunch("fleet2.log")
	wg.Wait()
	waitExited(t, "the old workers to exit", old)
	g.adv7WaitReady()
	for i := range 2 {
		if _, err := g.table(i); err != nil {
			t.Errorf("new worker %d's admin endpoint, once the old workers exited: %v", i, err)
		}
	}
	g.adv30Write(up.hostport(), 2, "v2")
	if err := g.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for g.adv7CountLog("orbit-fleet", "worker reloaded") < 2 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := g.adv7CountLog("orbit-fleet", "worker reloaded"); n != 2 {
		t.Errorf("%d of 2 new workers reloaded; log: %s", n, mpTail(g.adv7Log()))
	}
}

// TestValidateJoinsNoFleet: `caddy validate` runs no config, so the app
// does not join the fleet for it (see App.Provision): a deploy step that
// validates where it could not join (here, a socket directory that is not
// private, which a join refuses; or as another user than the fleet's)
// passes, and no segment is made.
func TestValidateJoinsNoFleet(t *testing.T) {
	dir := t.TempDir()
	seg, sock := filepath.Join(dir, "seg"), filepath.Join(dir, "sock")
	if err := os.Mkdir(sock, 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "Caddyfile")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf("{\n\torbit_pool {\n\t\tsegment %s\n\t\tsocket_dir %s\n\t}\n}\n:0 {\n\treverse_proxy 127.0.0.1:9 {\n\t\ttransport orbit_pool\n\t}\n}\n", seg, sock)), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(caddyBinary(t), "validate", "--config", cfg, "--adapter", "caddyfile")
	cmd.Env = append(os.Environ(), "HOME="+dir, "XDG_DATA_HOME="+dir, "XDG_CONFIG_HOME="+dir)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("caddy validate: %v\n%s", err, out)
	}
	if _, err := os.Lstat(seg); err == nil {
		t.Errorf("caddy validate made %s", seg)
	}
}
