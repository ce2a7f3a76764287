package caddymodule

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// deadlineSite proxies to upstream with deadline headers and transportOpts,
// answers refusals with their status, reason and deadline source, and tells
// the deadline source of a proxied response in a header.
func deadlineSite(port int, upstream, transportOpts string) string {
	return fmt.Sprintf(`:%d {
	bind 127.0.0.1
	reverse_proxy %s {
		transport orbit_pool {
			deadline_header Request-Timeout grpc-timeout
			%s
		}
		header_down X-Deadline-Source {http.vars.orbit_pool_deadline_source}
	}
	handle_errors 503 504 {
		@retry not vars {vars.orbit_pool_retry_after} ""
		header @retry Retry-After {vars.orbit_pool_retry_after}
		header X-Deadline-Source {vars.orbit_pool_deadline_source}
		respond "refused: {vars.orbit_pool_refusal}" {err.status_code}
	}
}
`, port, upstream, transportOpts)
}

// timedGet sends a GET with header h and returns the response, its body and
// how long it took.
func timedGet(t *testing.T, url string, h http.Header) (*http.Response, string, time.Duration) {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	for k, v := range h {
		req.Header[k] = v
	}
	start := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: reading body: %v", url, err)
	}
	return resp, string(b), time.Since(start)
}

// wantRefusal checks a refused request's status, reason (as the error route
// shows it), Retry-After ("" for none), and that it took between lo and hi.
func wantRefusal(t *testing.T, resp *http.Response, body string, took time.Duration, status int, reason, retryAfter string, lo, hi time.Duration) {
	t.Helper()
	if resp.StatusCode != status || body != "refused: "+reason || resp.Header.Get("Retry-After") != retryAfter {
		t.Fatalf("%d %q Retry-After %q, want %d %s with Retry-After %q", resp.StatusCode, body, resp.Header.Get("Retry-After"), status, reason, retryAfter)
	}
	if took < lo || took > hi {
		t.Errorf("refused after %v, want between %v and %v", took, lo, hi)
	}
}

// TestDeadlines runs requests with deadlines through Caddy: each case is one
// of seed 001's verdicts at the transport's claim points.
func TestDeadlines(t *testing.T) {
	up, block, entered := newBlockingUpstream(t)
	port := freePort(t)
	// One connection at most, so that a request can be made to wait.
	startCaddy(t, "deadline_near_window 50ms\n\t\twait_timeout 5s",
		deadlineSite(port, up.hostport(), "max_conns_per_host 1"))
	base := fmt.Sprintf("http://127.0.0.1:%d", port)

	t.Run("near deadline refused at once", func(t *testing.T) {
		before := up.requests.Load()
		for _, h := range []http.Header{{"Request-Timeout": {"0.030"}}, {"Grpc-Timeout": {"30m"}}} {
			resp, body, took := timedGet(t, base+"/", h)
			// At once: nowhere near the 30ms the client allowed, let alone
			// the wait timeout. The bound is loose for a loaded machine.
			wantRefusal(t, resp, body, took, 503, "deadline_near", "", 0, time.Second)
			if src := resp.Header.Get("X-Deadline-Source"); src != "header" {
				t.Errorf("%v: deadline source %q, want header", h, src)
			}
		}
		if n := up.requests.Load() - before; n != 0 {
			t.Errorf("the upstream saw %d requests; want none", n)
		}
	})

	t.Run("past deadline is 504", func(t *testing.T) {
		before := up.requests.Load()
		resp, body, took := timedGet(t, base+"/", http.Header{"Request-Timeout": {"0"}})
		wantRefusal(t, resp, body, took, 504, "deadline_elapsed", "", 0, time.Second)
		if n := up.requests.Load() - before; n != 0 {
			t.Errorf("the upstream saw %d requests; want none", n)
		}
	})

	// holdConn takes the one connection with a request the upstream holds
	// until release is called.
	holdConn := func(t *testing.T) (release func()) {
		t.Helper()
		return holdConnection(t, base, block, entered)
	}

	t.Run("room to wait, waits and succeeds", func(t *testing.T) {
		release := holdConn(t)
		time.AfterFunc(200*time.Millisecond, release)
		resp, body, took := timedGet(t, base+"/", http.Header{"Request-Timeout": {"3"}})
		if resp.StatusCode != 200 || body != "ok" {
			t.Fatalf("%d %q, want 200 ok", resp.StatusCode, body)
		}
		if src := resp.Header.Get("X-Deadline-Source"); src != "header" {
			t.Errorf("deadline source %q, want header", src)
		}
		if took < 150*time.Millisecond {
			t.Errorf("answered after %v: it did not wait for the connection", took)
		}
	})

	t.Run("wait ends at the deadline less the window", func(t *testing.T) {
		release := holdConn(t)
		defer release()
		resp, body, took := timedGet(t, base+"/", http.Header{"Grpc-Timeout": {"300m"}})
		// 250ms (300 less the 50ms window), not the 5s wait timeout.
		wantRefusal(t, resp, body, took, 503, "deadline_near", "", 200*time.Millisecond, 2*time.Second)
	})

	t.Run("wait timeout before the deadline is its own refusal", func(t *testing.T) {
		// One permit, held: the next request waits for it. The wait
		// timeout (200ms) comes before its deadline, and ends the wait as
		// wait_timeout, neither saturated nor a client's cancellation.
		port2 := freePort(t)
		startCaddy(t, "deadline_near_window 50ms\n\t\tmax_in_flight 1", deadlineSite(port2, up.hostport(), "wait_timeout 200ms"))
		base = fmt.Sprintf("http://127.0.0.1:%d", port2)
		release := holdConn(t)
		defer release()
		resp, body, took := timedGet(t, base+"/", http.Header{"Request-Timeout": {"10"}})
		wantRefusal(t, resp, body, took, 503, "wait_timeout", "1", 150*time.Millisecond, 3*time.Second)
		_, metrics := get(t, "http://"+adminAddr+"/metrics")
		// Every source's series is exposed from the start, at 0.
		if v := sampleValue(metrics, `caddy_orbit_pool_deadlines_total{source="header"}`); v < 1 {
			t.Errorf("deadlines_total counts %v requests whose deadline came from a header, want them counted", v)
		}
		for _, want := range []string{
			fmt.Sprintf(`caddy_orbit_pool_refused_total{reason="deadline_near",upstream="http://%s"}`, up.hostport()),
			fmt.Sprintf(`caddy_orbit_pool_refused_total{reason="deadline_elapsed",upstream="http://%s"}`, up.hostport()),
			fmt.Sprintf(`caddy_orbit_pool_refused_total{reason="wait_timeout",upstream="http://%s"}`, up.hostport()),
			"caddy_orbit_pool_budget_workers ",
			"caddy_orbit_pool_permits_in_use ",
			`caddy_orbit_pool_leaked_guards_total{kind="connection"} 0`,
			`caddy_orbit_pool_leaked_guards_total{kind="permit"} 0`,
			`caddy_orbit_pool_leaked_guards_total{kind="budget"} 0`,
		} {
			if !strings.Contains(metrics, want) {
				t.Errorf("metrics lack %s", want)
			}
		}
	})
}

// TestTransportTimeout: the transport's timeout bounds the whole exchange;
// a slow upstream is cut off with 504 when it passes.
func TestTransportTimeout(t *testing.T) {
	up := newUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slowhead" {
			select {
			case <-time.After(2 * time.Second):
			case <-r.Context().Done():
			}
		}
		io.WriteString(w, "ok")
	}), false)
	port := freePort(t)
	startCaddy(t, "deadline_near_window 50ms", deadlineSite(port, up.hostport(), "timeout 300ms"))
	base := fmt.Sprintf("http://127.0.0.1:%d", port)

	resp, body, _ := timedGet(t, base+"/", nil)
	if resp.StatusCode != 200 || body != "ok" || resp.Header.Get("X-Deadline-Source") != "timeout" {
		t.Fatalf("fast request: %d %q source %q", resp.StatusCode, body, resp.Header.Get("X-Deadline-Source"))
	}
	resp, body, took := timedGet(t, base+"/slowhead", nil)
	if resp.StatusCode != 504 || body != "refused: deadline_elapsed" {
		t.Fatalf("slow upstream: %d %q, want 504 deadline_elapsed", resp.StatusCode, body)
	}
	if took < 250*time.Millisecond || took > 1500*time.Millisecond {
		t.Errorf("cut off after %v, want about the 300ms timeout", took)
	}
	// A header asking for less wins over the timeout.
	resp, body, _ = timedGet(t, base+"/", http.Header{"Request-Timeout": {"0"}})
	if resp.StatusCode != 504 || resp.Header.Get("X-Deadline-Source") != "header" {
		t.Fatalf("header earlier than the timeout: %d %q source %q", resp.StatusCode, body, resp.Header.Get("X-Deadline-Source"))
	}
}
