package caddymodule

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// adv7 tests: the supervisor's reloads and restarts, attacked.

// adv7Globals is the global options block writeCaddyfile gives the fleet.
func (f *testFleet) adv7Globals() string {
	return f.globals(fmt.Sprintf("max_conns_per_host 4\n\t\twait_timeout 5s\n\t\treconcile_interval %s\n\t\tworkers %d",
		cmp.Or(f.reconcile, "50ms"), f.govWorkers))
}

// adv7Write writes the fleet's Caddyfile: its globals and sites.
func (f *testFleet) adv7Write(sites string) {
	f.t.Helper()
	if err := os.WriteFile(f.caddyfile, []byte(f.adv7Globals()+sites), 0o644); err != nil {
		f.t.Fatal(err)
	}
}

// adv7StartFleet is startFleet, returning once the supervisor has seen
// every worker ready: a reload reaches the workers it knows are ready.
func adv7StartFleet(t *testing.T, n int, upstream string) *testFleet {
	f := startFleet(t, n, upstream)
	f.adv7WaitReady()
	return f
}

func (f *testFleet) adv7WaitReady() {
	f.t.Helper()
	waitFor(f.t, 20*time.Second, "the supervisor to see every worker ready", func() bool {
		return f.adv7CountLog("orbit-fleet", "fleet ready") >= 1
	})
}

// adv7Log is the fleet's log so far.
func (f *testFleet) adv7Log() string {
	b, _ := os.ReadFile(f.logPath)
	return string(b)
}

// adv7CountLog counts the log lines holding every one of subs.
func (f *testFleet) adv7CountLog(subs ...string) int {
	n := 0
	for _, line := range strings.Split(f.adv7Log(), "\n") {
		all := true
		for _, s := range subs {
			if !strings.Contains(line, s) {
				all = false
				break
			}
		}
		if all {
			n++
		}
	}
	return n
}

// adv7Get sends GET url on a fresh connection with a timeout.
func adv7Get(url string, timeout time.Duration) result {
	c := &http.Client{Timeout: timeout, Transport: &http.Transport{DisableKeepAlives: true}}
	r := result{at: time.Now()}
	resp, err := c.Get(url)
	if err != nil {
		r.err = err
		return r
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	r.status = resp.StatusCode
	r.worker = resp.Header.Get("X-Worker")
	r.config = resp.Header.Get("X-Config")
	return r
}

// adv7WaitReplaced waits until worker i runs in a process other than old
// and is a member of the fleet with every other worker.
func (f *testFleet) adv7WaitReplaced(i, old int, d time.Duration) int {
	f.t.Helper()
	var pid int
	waitFor(f.t, d, fmt.Sprintf("worker %d to be replaced and join the fleet", i), func() bool {
		pid = f.workerPID(i)
		if pid == 0 || pid == old {
			return false
		}
		for j := range f.workers {
			ft, err := f.table(j)
			if err != nil || len(ft.Fleets) != 1 || len(ft.Fleets[0].Members) != f.workers {
				return false
			}
		}
		return true
	})
	return pid
}

// TestAdv7FleetBadReloadKeepsConfigForRestarts: a reload whose configuration
// adapts but fails to load in the workers leaves them serving the old one, as
// `caddy reload` does, and says so. A worker that dies afterwards must come
// back with the configuration the fleet runs, not the one every worker
// refused: otherwise it fails to start forever, and the connections the
// kernel queues on its slot's socket wait for an accept that never comes.
func TestAdv7FleetBadReloadKeepsConfigForRestarts(t *testing.T) {
	up := newFleetUpstream(t, 0)
	f := adv7StartFleet(t, 2, up.hostport())

	f.adv7Write(fmt.Sprintf(`:%d {
	bind 127.0.0.1
	header X-Worker {env.ORBIT_FLEET_WORKER}
	header X-Config bad
	reverse_proxy %s {
		transport http {
			tls_trust_pool file /nonexistent/adv7-ca.pem
		}
	}
}
`, f.port, up.hostport()))
	if err := f.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "both workers to refuse the bad configuration", func() bool {
		return f.adv7CountLog("adv7-ca.pem", "reloading worker") >= 2
	})
	for range 10 {
		if r := adv7Get(f.url("/"), 5*time.Second); r.err != nil || r.status != 200 || r.config != "v1" {
			t.Fatalf("after the refused reload: %v; want 200 from v1", r)
		}
	}

	victim := f.workerPID(1)
	if err := syscall.Kill(victim, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	f.adv7WaitReplaced(1, victim, 20*time.Second)
	seen := map[string]int{}
	for range 30 {
		r := adv7Get(f.url("/"), 5*time.Second)
		if r.err != nil || r.status != 200 || r.config != "v1" {
			t.Fatalf("after worker 1 was replaced: %v; want 200 from v1", r)
		}
		seen[r.worker]++
	}
	if seen["1"] == 0 {
		t.Errorf("the replaced worker 1 served none of 30 fresh connections: %v", seen)
	}
	// A good reload still works afterwards.
	f.writeCaddyfile(up.hostport(), "v2")
	f.cmd.Process.Signal(syscall.SIGHUP)
	f.adv7WaitAllOn("v2", 20*time.Second)
}

// adv7WaitAllOn waits until every worker answers with configuration version.
func (f *testFleet) adv7WaitAllOn(version string, d time.Duration) {
	f.t.Helper()
	seen := map[string]bool{}
	waitFor(f.t, d, "every worker to run configuration "+version, func() bool {
		r := adv7Get(f.url("/"), 5*time.Second)
		if r.err == nil && r.config == version {
			seen[r.worker] = true
		}
		return len(seen) == f.workers
	})
}

// TestAdv7FleetReloadDroppingAddress: a reload that drops one of the
// fleet's addresses stops the fleet listening on it, as a lone Caddy's
// reload does: a client is refused (or, in the instant the workers' servers
// hand over, served), never left waiting on a socket nobody accepts from.
// A later reload that brings the address back serves every client on it.
func TestAdv7FleetReloadDroppingAddress(t *testing.T) {
	up := newFleetUpstream(t, 0)
	f := newTestFleet(t, 2)
	port2 := freePort(t)
	site := func(port int, version string) string {
		return fmt.Sprintf(`:%d {
	bind 127.0.0.1
	header X-Worker {env.ORBIT_FLEET_WORKER}
	header X-Config %s
	reverse_proxy %s {
		transport orbit_pool
	}
}
`, port, version, up.hostport())
	}
	f.adv7Write(site(f.port, "v1") + site(port2, "v1"))
	f.launch()
	f.adv7WaitReady()
	url2 := fmt.Sprintf("http://127.0.0.1:%d/", port2)
	for range 6 {
		if r := adv7Get(url2, 5*time.Second); r.err != nil || r.status != 200 {
			t.Fatalf("second address before the reload: %v", r)
		}
	}

	f.adv7Write(site(f.port, "v2"))
	f.cmd.Process.Signal(syscall.SIGHUP)
	f.adv7WaitAllOn("v2", 20*time.Second)
	waitFor(t, 20*time.Second, "both workers to finish the reload", func() bool {
		return f.adv7CountLog("worker reloaded") >= 2
	})
	time.Sleep(500 * time.Millisecond)
	hung := 0
	for range 10 {
		r := adv7Get(url2, 2*time.Second)
		var ne net.Error
		if errors.As(r.err, &ne) && ne.Timeout() {
			hung++
		}
	}
	if hung > 0 {
		t.Errorf("%d of 10 clients of the dropped address hung unanswered for 2s; a lone Caddy refuses them", hung)
	}
	// A worker started since (without the dropped address's socket)
	// serves the address that remains.
	victim := f.workerPID(1)
	syscall.Kill(victim, syscall.SIGKILL)
	f.adv7WaitReplaced(1, victim, 20*time.Second)
	for range 10 {
		if r := adv7Get(f.url("/"), 5*time.Second); r.err != nil || r.status != 200 || r.config != "v2" {
			t.Fatalf("the remaining address after worker 1 was replaced: %v", r)
		}
	}

	f.adv7Write(site(f.port, "v3") + site(port2, "v3"))
	f.cmd.Process.Signal(syscall.SIGHUP)
	waitFor(t, 20*time.Second, "both workers to reload again", func() bool {
		return f.adv7CountLog("worker reloaded") >= 4
	})
	var bad []result
	for range 20 {
		if r := adv7Get(url2, 3*time.Second); r.err != nil || r.status != 200 || r.config != "v3" {
			bad = append(bad, r)
		}
	}
	if len(bad) > 0 {
		t.Errorf("%d of 20 requests to the address brought back failed, first: %v", len(bad), bad[0])
	}
}

// TestAdv7FleetRapidReloads: five SIGHUPs, each with a new configuration,
// faster than a reload takes, under load: no request fails, and every
// worker ends on the last configuration.
func TestAdv7FleetRapidReloads(t *testing.T) {
	up := newFleetUpstream(t, 5*time.Millisecond)
	f := adv7StartFleet(t, 2, up.hostport())
	endLoad := loadInBackground(f.url("/"), 4)
	time.Sleep(300 * time.Millisecond)
	for v := 2; v <= 6; v++ {
		f.writeCaddyfile(up.hostport(), "v"+strconv.Itoa(v))
		if err := f.cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		time.Sleep(30 * time.Millisecond)
	}
	f.adv7WaitAllOn("v6", 30*time.Second)
	time.Sleep(300 * time.Millisecond)
	rs := endLoad()
	if bad := failures(rs); len(bad) > 0 {
		t.Fatalf("%d of %d requests failed across rapid reloads, first: %v", len(bad), len(rs), bad[0])
	}
	// Once on v6, a worker stays there.
	for range 10 {
		if r := adv7Get(f.url("/"), 5*time.Second); r.config != "v6" {
			t.Fatalf("after the reloads settled: %v", r)
		}
	}
}
