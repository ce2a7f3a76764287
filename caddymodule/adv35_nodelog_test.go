package caddymodule

import (
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/orbitproxy/orbit/proxy"
)

// TestAdv35NodeLogsFollowReload: a reload that keeps the fleet settings
// keeps the membership, which from then on logs to the new config's logger
// (the old config's logs are closed once it stops). The node, which serves
// the siblings' streams, is part of the membership: what it logs after the
// reload (here a peer stream closed on a malformed frame) must go to the
// running config's log, not to the first config's.
func TestAdv35NodeLogsFollowReload(t *testing.T) {
	up := newUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ok")
	}), false)
	port := freePort(t)
	dir := t.TempDir()
	firstLog, runLog := filepath.Join(dir, "first.log"), filepath.Join(dir, "run.log")
	startCaddyGlobal(t, logTo(firstLog), "", site(port, up.hostport(), "", ""))
	ft := fleetTable(t)
	seg, sockDir, lane := ft.Fleets[0].Segment, ft.Fleets[0].SocketDir, ft.Fleets[0].Lane
	next := reloadSite{logFile: runLog, seg: seg, port: port, upstream: up.hostport()}
	if code := next.load(t); code != 200 {
		t.Fatalf("reload: %d", code)
	}
	if ft := fleetTable(t); len(ft.Fleets) != 1 || ft.Fleets[0].Lane != lane {
		t.Fatalf("the reload did not keep the membership: %+v", ft.Fleets)
	}
	c, err := net.Dial("unix", proxy.SocketPath(sockDir, lane))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write([]byte(strings.Repeat("\xff", 512)))
	c.(*net.UnixConn).CloseWrite()
	io.Copy(io.Discard, c)
	awaitLogLine(t, runLog, firstLog, `"peer stream closed"`, "what the node logs after the reload")
}
