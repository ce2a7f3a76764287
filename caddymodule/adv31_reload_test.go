package caddymodule

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestAdv31FailedReloadKeepsLogger: a reload that keeps the fleet settings
// takes the running membership in Provision, and then fails (a header_up
// regexp that does not compile). The running config, and its membership,
// must log where they did: the failed config's logs were never in use and
// Caddy closes them. Here the running config logs to run.log, the failed
// one to refused.log; a later reload that changes the settings (a new
// membership) makes the old membership leave, and its "leaving the fleet"
// must be in run.log.
func TestAdv31FailedReloadKeepsLogger(t *testing.T) {
	up := newUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ok")
	}), false)
	port := freePort(t)
	dir := t.TempDir()
	runLog, refusedLog := filepath.Join(dir, "run.log"), filepath.Join(dir, "refused.log")
	logTo := func(p string) string { return "log default {\n\t\toutput file " + p + "\n\t}" }
	startCaddyGlobal(t, logTo(runLog), "", site(port, up.hostport(), "", ""))
	seg := fleetTable(t).Fleets[0].Segment
	load := func(logFile, opts, extra string) int {
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
		%s
	}
}
`, logTo(logFile), seg, opts, port, up.hostport(), extra)
		req, _ := http.NewRequest("POST", "http://localhost:2999/load", strings.NewReader(cfg))
		req.Header.Set("Content-Type", "text/caddyfile")
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := load(refusedLog, "", `header_up X-Bad "(" "x"`); code == 200 {
		t.Fatal("the bad reload was taken")
	}
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
			t.Fatalf("the old membership's \"leaving the fleet\" is not in the running config's log; the refused config's log has:\n%s", r)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
