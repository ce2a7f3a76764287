package caddymodule

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// adv7Leftovers lists what a stopped fleet left behind: its segment, the
// segment's socket directory, and the workers' admin sockets and pid files.
func (f *testFleet) adv7Leftovers() []string {
	var left []string
	for _, p := range []string{f.segment, f.segment + ".sock"} {
		if _, err := os.Lstat(p); err == nil {
			left = append(left, p)
		}
	}
	ents, _ := os.ReadDir(f.runDir)
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ".sock") || strings.HasSuffix(e.Name(), ".pid") {
			left = append(left, filepath.Join(f.runDir, e.Name()))
		}
	}
	return left
}

// adv7Relaunch starts a new supervisor for f's configuration, run
// directory, port and segment.
func (f *testFleet) adv7Relaunch(logName string) *testFleet {
	g := *f
	g.cmd = nil
	g.logPath = filepath.Join(f.dir, logName)
	g.launch()
	return &g
}

// TestAdv7FleetSupervisorKilledThenRestarted: the supervisor dies by
// SIGKILL. Its workers stop (gracefully) rather than serve on unsupervised,
// and leave the segment and their sockets behind no more than a clean stop
// does; a new fleet started in the same run directory, on the same port and
// segment, starts, serves, counts only its own workers as members, and when
// it stops leaves nothing behind.
func TestAdv7FleetSupervisorKilledThenRestarted(t *testing.T) {
	up := newFleetUpstream(t, 0)
	f := adv7StartFleet(t, 2, up.hostport())
	pids := []int{f.workerPID(0), f.workerPID(1)}
	if err := f.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	f.cmd.Wait()
	waitExited(t, "the workers of the killed supervisor to exit", pids)
	// The workers stopped on their own: they left the segment and their
	// sockets, as in a clean stop. (The supervisor's pid files, and the
	// links of the stable names to its workers' sockets, are its own to
	// remove.)
	for _, p := range f.adv7Leftovers() {
		if fi, err := os.Lstat(p); err == nil && fi.Mode().Type() == os.ModeSymlink {
			continue
		}
		if !strings.HasSuffix(p, ".pid") {
			t.Errorf("the workers of a killed supervisor left %s behind", p)
		}
	}

	g := f.adv7Relaunch("fleet2.log")
	for range 10 {
		if r := adv7Get(g.url("/"), 5*time.Second); r.err != nil || r.status != 200 {
			t.Fatalf("the new fleet: %v", r)
		}
	}
	ft, err := g.table(0)
	if err != nil || len(ft.Fleets) != 1 || len(ft.Fleets[0].Members) != 2 {
		t.Fatalf("the new fleet's table: %+v, %v", ft, err)
	}
	for _, m := range ft.Fleets[0].Members {
		for _, pid := range pids {
			if m.PID == pid {
				t.Errorf("the dead worker %d is still a member", pid)
			}
		}
	}
	if err := g.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := g.cmd.Wait(); err != nil {
		t.Errorf("the new fleet exited with %v after SIGTERM", err)
	}
	if left := processesNaming(f.runDir); len(left) > 0 {
		t.Errorf("processes of the fleet still running after it stopped: %v", left)
	}
	if left := g.adv7Leftovers(); len(left) > 0 {
		t.Errorf("a stopped fleet left %v behind", left)
	}
	if c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", g.port), time.Second); err == nil {
		c.Close()
		t.Error("the port still accepts connections after the fleet stopped")
	}
}

// TestAdv7FleetCrashLoopBackoff: a worker that keeps dying is restarted
// after a delay that doubles (100ms, 200ms, ...), not at once, and one at a
// time; once it stays up it serves again.
func TestAdv7FleetCrashLoopBackoff(t *testing.T) {
	up := newFleetUpstream(t, 0)
	f := adv7StartFleet(t, 2, up.hostport())
	const kills = 5
	pid := f.workerPID(1)
	var first time.Time
	for k := range kills {
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		if k == 0 {
			first = time.Now()
		}
		old := pid
		waitFor(t, 30*time.Second, "a replacement of worker 1", func() bool {
			pid = f.workerPID(1)
			return pid != 0 && pid != old
		})
		// One worker 1 at a time.
		n := 0
		for _, p := range processesNaming(f.runDir) {
			if b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/environ", p)); bytes.Contains(b, []byte("ORBIT_FLEET_WORKER=1\x00")) {
				n++
			}
		}
		if n > 1 {
			t.Errorf("after kill %d, %d worker 1 processes run at once", k+1, n)
		}
	}
	// The delays before the five restarts: 100+200+400+800+1600ms.
	if d := time.Since(first); d < 2500*time.Millisecond {
		t.Errorf("%d restarts of a worker that kept dying took %s: no backoff", kills, d)
	}
	// The supervisor writes a worker's pid file before it logs the start,
	// so the last start's line may trail the pid the loop saw.
	started := func() int { return f.adv7CountLog("worker started", `"worker":1`) }
	waitFor(t, 10*time.Second, "the log of worker 1's last start", func() bool { return started() >= kills+1 })
	if n := started(); n != kills+1 {
		t.Errorf("worker 1 was started %d times for %d kills", n, kills)
	}
	f.adv7WaitReplaced(1, 0, 20*time.Second)
	seen := map[string]bool{}
	for range 30 {
		r := adv7Get(f.url("/"), 5*time.Second)
		if r.err != nil || r.status != 200 {
			t.Fatalf("after the crash loop: %v", r)
		}
		seen[r.worker] = true
	}
	if !seen["1"] {
		t.Errorf("worker 1 served none of 30 fresh connections after its crash loop: %v", seen)
	}
}

// TestAdv7FleetStopDuringReload: SIGTERM to the supervisor while a reload
// it started is under way, under load. The fleet stops (exit 0) within its
// stop timeout, every worker exits, nothing is left behind, no request is
// answered with an error, and no more connections are dropped than the stop
// tests allow.
func TestAdv7FleetStopDuringReload(t *testing.T) {
	const clients = 8
	up := newFleetUpstream(t, 20*time.Millisecond)
	f := adv7StartFleet(t, 2, up.hostport())
	pids := []int{f.workerPID(0), f.workerPID(1)}
	endLoad := loadInBackground(f.url("/"), clients)
	time.Sleep(500 * time.Millisecond)
	f.writeCaddyfile(up.hostport(), "v2")
	f.cmd.Process.Signal(syscall.SIGHUP)
	waitFor(t, 10*time.Second, "the reload to begin", func() bool {
		return f.adv7CountLog("admin.api", "/load") >= 1
	})
	stopAt := time.Now()
	if err := f.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- f.cmd.Wait() }()
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("fleet exited with %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the fleet did not stop within 20s of SIGTERM during a reload")
	}
	took := time.Since(stopAt)
	rs := endLoad()
	var dropped, failed []result
	for _, r := range rs {
		var oe *net.OpError
		switch {
		case errors.As(r.err, &oe) && oe.Op == "dial":
		case r.err != nil:
			dropped = append(dropped, r)
		case r.status != 200:
			failed = append(failed, r)
		}
	}
	t.Logf("%d requests, %d dropped, %d failed; the fleet stopped in %s", len(rs), len(dropped), len(failed), took)
	if len(failed) > 0 {
		t.Errorf("%d requests answered with an error, first: %v", len(failed), failed[0])
	}
	if len(dropped) > clients/2 {
		t.Errorf("%d connections dropped unanswered, first: %v", len(dropped), dropped[0])
	}
	for _, pid := range pids {
		if syscall.Kill(pid, 0) == nil {
			t.Errorf("worker %d still running after the fleet exited", pid)
		}
	}
	if left := processesNaming(f.runDir); len(left) > 0 {
		t.Errorf("processes of the fleet still running: %v", left)
	}
	deadline := time.Now().Add(5 * time.Second)
	for left := f.adv7Leftovers(); len(left) > 0; left = f.adv7Leftovers() {
		if time.Now().After(deadline) {
			t.Fatalf("left behind 5s after the fleet exited: %v", left)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestAdv7FleetStopKeepAlive: a stop while clients hold keep-alive
// connections with requests in flight fails no more requests than stock
// Caddy stopped the same way in the same run.
func TestAdv7FleetStopKeepAlive(t *testing.T) {
	const clients = 12
	up := newFleetUpstream(t, 20*time.Millisecond)
	type outcome struct{ answered, refused, dropped, failed int }
	run := func(t *testing.T, url string, pids []int, stop func() error) (o outcome) {
		c := &http.Client{Timeout: 15 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: clients}}
		defer c.CloseIdleConnections()
		done := make(chan struct{})
		type res struct {
			status int
			err    error
		}
		out := make(chan res, 1<<16)
		finished := make(chan struct{})
		go func() {
			defer close(finished)
			sem := make(chan struct{}, clients)
			for {
				select {
				case <-done:
					for range clients {
						sem <- struct{}{}
					}
					return
				case sem <- struct{}{}:
				}
				go func() {
					defer func() { <-sem }()
					resp, err := c.Get(url)
					if err != nil {
						out <- res{err: err}
						return
					}
					_, err = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					out <- res{status: resp.StatusCode, err: err}
				}()
			}
		}()
		time.Sleep(time.Second)
		if err := stop(); err != nil {
			t.Fatal(err)
		}
		waitExited(t, "every process to exit", pids)
		close(done)
		<-finished
		close(out)
		var first error
		for r := range out {
			var oe *net.OpError
			switch {
			case errors.As(r.err, &oe) && oe.Op == "dial":
				o.refused++
			case r.err != nil:
				o.dropped++
				if first == nil {
					first = r.err
				}
			case r.status == 200:
				o.answered++
			default:
				o.failed++
			}
		}
		if o.answered == 0 {
			t.Fatal("no request was answered")
		}
		if first != nil {
			t.Logf("first drop: %v", first)
		}
		return o
	}
	stock, stockURL := startStockServing(t, up.hostport())
	base := run(t, stockURL, []int{stock.Process.Pid}, func() error { return stock.Process.Signal(syscall.SIGTERM) })
	f := adv7StartFleet(t, 2, up.hostport())
	o := run(t, f.url("/"), []int{f.workerPID(0), f.workerPID(1)}, func() error { return f.cmd.Process.Signal(syscall.SIGTERM) })
	t.Logf("keep-alive clients: fleet %+v; stock caddy %+v", o, base)
	if o.failed > base.failed {
		t.Errorf("%d requests answered with an error while the fleet stopped; stock caddy: %d", o.failed, base.failed)
	}
	if o.dropped > max(base.dropped, clients/2) {
		t.Errorf("%d requests dropped unanswered while the fleet stopped; stock caddy: %d", o.dropped, base.dropped)
	}
}
