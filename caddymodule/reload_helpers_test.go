package caddymodule

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"
)

// reloadSite is a config the reload tests post to a process that
// startCaddyGlobal started: one site on port proxied to upstream through
// orbit_pool on segment seg.
type reloadSite struct {
	logFile  string // where the default log goes; stderr when empty
	seg      string
	opts     string // orbit_pool app options
	port     int
	upstream string
	extra    string // reverse_proxy options
	more     string // sites after the first
}

func (r reloadSite) caddyfile() string {
	var logs string
	if r.logFile != "" {
		logs = logTo(r.logFile)
	}
	return fmt.Sprintf(`{
	admin `+adminAddr+`
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
%s
`, logs, r.seg, r.opts, r.port, r.upstream, r.extra, r.more)
}

// load posts the config and returns the status.
func (r reloadSite) load(t *testing.T) int {
	t.Helper()
	return postLoad(t, r.caddyfile())
}

// logTo is the global option that sends the default log to file p.
func logTo(p string) string { return "log default {\n\t\toutput file " + p + "\n\t}" }

// unbindable is a site on a port already in use: a config with it is
// refused in Start, once its apps (orbit_pool among them, maybe) started.
func unbindable(t *testing.T) string {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { busy.Close() })
	return fmt.Sprintf(":%d {\n\tbind 127.0.0.1\n\trespond ok\n}", busy.Addr().(*net.TCPAddr).Port)
}

// postLoad posts a Caddyfile to the admin endpoint and returns the status,
// each time on a new connection: a load replaces the admin server, which
// closes the idle connections of the old one. A refused load replaces it
// twice (the running config is loaded again), and stock Caddy then
// sometimes closes a connection its old admin server had just accepted
// (EOF or reset before any answer): such a load is posted again.
func postLoad(t *testing.T, cfg string) int {
	t.Helper()
	c := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	var err error
	for range 3 {
		req, _ := http.NewRequest("POST", "http://"+adminAddr+"/load", strings.NewReader(cfg))
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

// awaitLogLine waits up to 5 s for a line with msg (a JSON-quoted message)
// in the log file want; it fails showing the lines with msg in the log file
// other, where it must not have gone.
func awaitLogLine(t *testing.T, want, other, msg, what string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		b, _ := os.ReadFile(want)
		if strings.Contains(string(b), msg) {
			return
		}
		if time.Now().After(deadline) {
			o, _ := os.ReadFile(other)
			t.Fatalf("%s: %s is not in %s; %s has:\n%s", what, msg, want, other, grepLines(string(o), msg))
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

// servesAfterRefusals checks that the running config serves on port
// after refused reloads. A reload refused in Start loses, now and then, a
// connection its server accepted from the running one's socket before
// Caddy stopped it (stock Caddy does, with reverse_proxy's own transport:
// about 2 requests in 100 right after such a reload), so a request is
// tried three times on fresh connections.
func servesAfterRefusals(t *testing.T, port int) {
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
