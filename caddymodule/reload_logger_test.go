package caddymodule

import (
	"io"
	"net/http"
	"path/filepath"
	"testing"
)

// TestRefusedReloadKeepsLogger: a reload that keeps the fleet settings
// takes the running membership in Provision, and is then refused: by a
// header_up regexp that does not compile (in Provision), or by a server
// that cannot bind (in Start, after the orbit_pool app itself started, as
// Caddy starts a config's apps in no set order, so of ten such reloads
// some start orbit_pool first). The running config, and its membership,
// must log where they did: the refused config's logs are closed. Here the
// running config logs to run.log, the refused one to refused.log; a later
// reload that changes the settings (a new membership) makes the old
// membership leave, and its "leaving the fleet" must be in run.log.
func TestRefusedReloadKeepsLogger(t *testing.T) {
	for _, tc := range []struct {
		name        string
		extra, more func(t *testing.T) string
	}{
		{"in Provision", func(*testing.T) string { return `header_up X-Bad "(" "x"` }, func(*testing.T) string { return "" }},
		{"in Start", func(*testing.T) string { return "" }, unbindable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := newUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				io.WriteString(w, "ok")
			}), false)
			port := freePort(t)
			dir := t.TempDir()
			runLog, refusedLog := filepath.Join(dir, "run.log"), filepath.Join(dir, "refused.log")
			startCaddyGlobal(t, logTo(runLog), "", site(port, up.hostport(), "", ""))
			seg := fleetTable(t).Fleets[0].Segment
			refused := reloadSite{logFile: refusedLog, seg: seg, port: port, upstream: up.hostport(), extra: tc.extra(t), more: tc.more(t)}
			for range 10 {
				if code := refused.load(t); code == 200 {
					t.Fatal("the refused reload was taken")
				}
			}
			servesAfterRefusals(t, port)
			next := reloadSite{logFile: runLog, seg: seg, opts: "max_in_flight 77", port: port, upstream: up.hostport()}
			if code := next.load(t); code != 200 {
				t.Fatalf("reload: %d", code)
			}
			awaitLogLine(t, runLog, refusedLog, `"leaving the fleet"`, "the old membership's leaving")
		})
	}
}
