package caddymodule

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestAdv35ReloadRefusedInStartKeepsLogger: as TestAdv31FailedReloadKeepsLogger,
// but the reload that keeps the fleet settings is refused in Start (one of
// its servers cannot bind), after the orbit_pool app itself started: Caddy
// starts a config's apps in no set order, so of ten such reloads some start
// orbit_pool first. The running config, and its membership, must still log
// where they did: a later reload that changes the settings makes the old
// membership leave, and its "leaving the fleet" must be in run.log, not in
// the refused config's refused.log (which Caddy closed).
func TestAdv35ReloadRefusedInStartKeepsLogger(t *testing.T) {
	up := newUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ok")
	}), false)
	port := freePort(t)
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	busyPort := busy.Addr().(*net.TCPAddr).Port
	dir := t.TempDir()
	runLog, refusedLog := filepath.Join(dir, "run.log"), filepath.Join(dir, "refused.log")
	logTo := func(p string) string { return "log default {\n\t\toutput file " + p + "\n\t}" }
	startCaddyGlobal(t, logTo(runLog), "", site(port, up.hostport(), "", ""))
	seg := fleetTable(t).Fleets[0].Segment
	load := func(logFile, opts, more string) int {
		cfg := fmt.Sprintf(`{
	admin localhost:2999
	auto_https off
	persist_config off
	grace_period 1s
	%s
	orbit_pool {
		segment %s
		reconcile_interval 50ms
		%s
	}
}
:%d {
	bind 127.0.0.1
	reverse_proxy %s {
		transport orbit_pool
	}
}
%s
`, logTo(logFile), seg, opts, port, up.hostport(), more)
		return adv35Load(t, cfg)
	}
	for range 10 {
		if code := load(refusedLog, "", fmt.Sprintf(":%d {\n\tbind 127.0.0.1\n\trespond ok\n}", busyPort)); code == 200 {
			t.Fatal("a reload onto a port in use was taken")
		}
	}
	adv35ServesAfterRefusals(t, port)
	if code := load(runLog, "max_in_flight 77", ""); code != 200 {
		t.Fatalf("reload: %d", code)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		b, _ := os.ReadFile(runLog)
		if strings.Contains(string(b), `"leaving the fleet"`) {
			break
		}
		if time.Now().After(deadline) {
			r, _ := os.ReadFile(refusedLog)
			t.Fatalf("the old membership's \"leaving the fleet\" is not in the running config's log; the refused config's log has:\n%s", grepLines(string(r), "leaving the fleet"))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// adv35ServesAfterRefusals checks that the running config serves on port
// after refused reloads. A reload refused in Start loses, now and then, a
// connection its server accepted from the running one's socket before
// Caddy stopped it (stock Caddy does, with reverse_proxy's own transport:
// about 2 requests in 100 right after such a reload), so a request is
// tried three times on fresh connections.
func adv35ServesAfterRefusals(t *testing.T, port int) {
	t.Helper()
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	var last string
	for range 3 {
		r, err := c.Get(fmt.Sprintf("http://127.0.0.1:%d/", port))
		if err == nil {
			b, _ := io.ReadAll(r.Body)
			r.Body.Close()
			if r.StatusCode == 200 {
				return
			}
			last = fmt.Sprintf("%d %s", r.StatusCode, b)
		} else {
			last = err.Error()
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("after the refused reloads: %s", last)
}

// adv35Load posts a Caddyfile to the admin endpoint and returns the status,
// each time on a new connection: a load replaces the admin server, which
// closes the idle connections of the old one. A refused load replaces it
// twice (the running config is loaded again), and stock Caddy then
// sometimes closes a connection its old admin server had just accepted
// (EOF or reset before any answer): such a load is posted again.
func adv35Load(t *testing.T, cfg string) int {
	t.Helper()
	c := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	var err error
	for range 3 {
		req, _ := http.NewRequest("POST", "http://localhost:2999/load", strings.NewReader(cfg))
		req.Header.Set("Content-Type", "text/caddyfile")
		var resp *http.Response
		if resp, err = c.Do(req); err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			return resp.StatusCode
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatal(err)
	return 0
}
