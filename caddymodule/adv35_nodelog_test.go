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
	logTo := func(p string) string { return "log default {\n\t\toutput file " + p + "\n\t}" }
	startCaddyGlobal(t, logTo(firstLog), "", site(port, up.hostport(), "", ""))
	ft := fleetTable(t)
	seg, sockDir, lane := ft.Fleets[0].Segment, ft.Fleets[0].SocketDir, ft.Fleets[0].Lane
	cfg := fmt.Sprintf(`{
	admin localhost:2999
	auto_https off
	persist_config off
	grace_period 1s
	%s
	orbit_pool {
		segment %s
		reconcile_interval 50ms
	}
}
:%d {
	bind 127.0.0.1
	reverse_proxy %s {
		transport orbit_pool
	}
}
`, logTo(runLog), seg, port, up.hostport())
	if code := adv35Load(t, cfg); code != 200 {
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
	deadline := time.Now().Add(5 * time.Second)
	for {
		b, _ := os.ReadFile(runLog)
		if strings.Contains(string(b), `"peer stream closed"`) {
			return
		}
		if time.Now().After(deadline) {
			f, _ := os.ReadFile(firstLog)
			t.Fatalf("the node's \"peer stream closed\" after the reload is not in the running config's log; the first config's log has:\n%s", grepLines(string(f), "peer stream closed"))
		}
		time.Sleep(50 * time.Millisecond)
	}
}
