package caddymodule

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"testing"
	"time"
)

// TestAdv35RefusedReloadsLeakNothing: a reload that changes the fleet
// settings joins a new membership in orbit's Provision (another lane of the
// same segment); when the config is then refused, by a later module's
// Provision or by a server that cannot bind in Start, that membership must
// be let go: after ten refused reloads of each kind the process holds one
// membership, the segment counts one member (this process, once), and no
// file descriptor is left over.
func TestAdv35RefusedReloadsLeakNothing(t *testing.T) {
	up := newUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ok")
	}), false)
	port := freePort(t)
	startCaddyGlobal(t, "", "", site(port, up.hostport(), "", ""))
	seg := fleetTable(t).Fleets[0].Segment
	if r, _ := get(t, fmt.Sprintf("http://127.0.0.1:%d/", port)); r.StatusCode != 200 {
		t.Fatalf("warm-up: %d", r.StatusCode)
	}
	load := func(opts, extra, more string) int {
		return reloadSite{seg: seg, opts: opts, port: port, upstream: up.hostport(), extra: extra, more: more}.load(t)
	}
	refusedInStart := unbindable(t)
	fdList := func() map[string]string {
		m := map[string]string{}
		ents, _ := os.ReadDir("/proc/self/fd")
		for _, e := range ents {
			l, _ := os.Readlink("/proc/self/fd/" + e.Name())
			m[e.Name()] = l
		}
		return m
	}
	fds := func() int { return len(fdList()) }
	first := fdList()
	// Ten refused reloads that each kept a descriptor would add ten; a
	// few may come and go with the connections of the tests before this
	// one (seen once in 200 runs: four).
	const fdSlack = 5
	check := func(when string, fdsBefore int) {
		t.Helper()
		var ft FleetTable
		var fdsNow int
		deadline := time.Now().Add(5 * time.Second)
		for {
			ft = fleetTable(t)
			client.CloseIdleConnections()
			fdsNow = fds()
			if len(ft.Fleets) == 1 && len(ft.Fleets[0].Members) == 1 && fdsNow <= fdsBefore+fdSlack {
				return
			}
			if time.Now().After(deadline) {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		var extra []string
		for k, v := range fdList() {
			if first[k] != v {
				extra = append(extra, k+"->"+v)
			}
		}
		t.Logf("new fds: %v", extra)
		t.Errorf("%s: %d memberships (want 1), members %+v (want this process once), fds %d -> %d",
			when, len(ft.Fleets), members(ft), fdsBefore, fdsNow)
	}
	client.CloseIdleConnections()
	before := fds()
	for i := range 10 {
		if code := load(fmt.Sprintf("max_in_flight %d", 100+i), `header_up X-Bad "(" "x"`, ""); code == 200 {
			t.Fatal("a reload refused in Provision was taken")
		}
	}
	check("after 10 reloads refused in Provision", before)
	for i := range 10 {
		if code := load(fmt.Sprintf("max_in_flight %d", 200+i), "", refusedInStart); code == 200 {
			t.Fatal("a reload refused in Start was taken")
		}
	}
	check("after 10 reloads refused in Start", before)
	servesAfterRefusals(t, port)
}
