package scenario

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/integration/upstream"
)

// caddyBin is built once for the package's tests.
var caddyBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "orbit-scenario-test-*")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	caddyBin, err = BuildCaddy(ctx, dir)
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// short bounds the scenarios CI runs: seconds each, a modest load.
const (
	shortLoad    = 2 * time.Second
	shortConns   = 64
	shortWorkers = 3
)

// shortTempDir is a temporary directory whose path leaves room for the
// fleet's unix sockets under it (sun_path is 108 bytes); t.TempDir's paths,
// which carry the test's name, may not.
func shortTempDir(tb testing.TB) string {
	tb.Helper()
	dir, err := os.MkdirTemp("", "osc-")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func runOrbit(t *testing.T, s Scenario, opts ...func(*Runner)) Row {
	t.Helper()
	if s.Duration == 0 {
		s.Duration = shortLoad
	}
	if s.Conns == 0 {
		s.Conns = shortConns
	}
	r := &Runner{Caddy: caddyBin, Workers: shortWorkers, Dir: shortTempDir(t)}
	for _, o := range opts {
		o(r)
	}
	row, err := r.Run(context.Background(), s, Orbit)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("%s: what the fleet printed:\n%s", s.Name, row.Log)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: %d requests, %.0f req/s, p99 %v, %d new upstream conns (peak %d), errors: %s",
		s.Name, row.Load.Requests, row.Load.RPS(), row.Load.P99, row.Upstream.Accepted, row.Upstream.Peak, row.Load.ErrorSummary())
	for _, n := range row.Notes {
		t.Logf("%s: %s", s.Name, n)
	}
	if row.Load.Requests == 0 {
		t.Fatalf("%s: no request completed", s.Name)
	}
	return row
}

func noErrors(t *testing.T, row Row) {
	t.Helper()
	if n := row.Load.ErrorCount(); n != 0 {
		t.Fatalf("%s: %d errors: %s", row.Scenario, n, row.Load.ErrorSummary())
	}
}

// TestFastSharesConnections also asks for the workers' CPU profiles over
// the load (orbit-demo -cpuprofile).
func TestFastSharesConnections(t *testing.T) {
	profiles := t.TempDir()
	row := runOrbit(t, Scenario{Name: "fast"}, func(r *Runner) { r.Profiles = profiles })
	noErrors(t, row)
	// The load needs at most shortConns upstream connections at once; a
	// worker dials another only when it has relayed through siblings'
	// for a while (RelayDials).
	if row.Upstream.Peak > int64(shortConns+row.RelayDials) || row.Reuse() < 0.95 {
		t.Fatalf("peak %d upstream connections for %d client connections (%d dialed after relays), reuse %.3f", row.Upstream.Peak, shortConns, row.RelayDials, row.Reuse())
	}
	bin, err := filepath.EvalSymlinks(caddyBin)
	if err != nil {
		t.Fatal(err)
	}
	for i := range shortWorkers {
		f, err := os.Open(filepath.Join(profiles, fmt.Sprintf("fast-orbit-worker-%d.pprof", i)))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		// A profile is a gzipped protocol buffer whose string table
		// names its sample types (a CPU profile's are samples and cpu)
		// and the executable it sampled.
		zr, err := gzip.NewReader(f)
		if err != nil {
			t.Fatalf("worker %d's profile: %v", i, err)
		}
		b, err := io.ReadAll(zr)
		if err != nil {
			t.Fatalf("worker %d's profile: %v", i, err)
		}
		if !bytes.Contains(b, []byte("samples")) || !bytes.Contains(b, []byte("cpu")) || !bytes.Contains(b, []byte(bin)) {
			t.Errorf("worker %d's profile (%d bytes) is not a CPU profile of orbit's Caddy", i, len(b))
		}
	}
}

func TestCapHoldsFleetWide(t *testing.T) {
	row := runOrbit(t, capped("capped"))
	noErrors(t, row)
	heldTheCap(t, row)
	owned := 0
	for _, n := range row.Owned {
		owned += n
	}
	if len(row.Owned) != shortWorkers || owned == 0 || owned > cappedLimit {
		t.Fatalf("workers owned %v upstream connections at the end, cap %d", row.Owned, cappedLimit)
	}
	if row.Upstream.Accepted > int64(cappedLimit+row.Moves) {
		t.Fatalf("the upstream accepted %d connections, cap %d: more than the %d that moves to another worker replaced", row.Upstream.Accepted, cappedLimit, row.Moves)
	}
}

func TestStampedeWithinCreationBudget(t *testing.T) {
	const dialing = 4
	row := runOrbit(t, Scenario{
		Name:       "stampede",
		Upstream:   upstream.Options{Delay: 20 * time.Millisecond},
		MaxDialing: dialing,
	})
	noErrors(t, row)
	if row.FirstSecond == 0 || row.Upstream.Accepted > int64(shortConns+row.RelayDials) {
		t.Fatalf("%d connections in the first second, %d in all (%d dialed after relays), for %d client connections", row.FirstSecond, row.Upstream.Accepted, row.RelayDials, shortConns)
	}
}

func TestReloadUnderLoadFailsNothing(t *testing.T) {
	row := runOrbit(t, Scenario{Name: "reload", Upstream: upstream.Options{Delay: 2 * time.Millisecond}, During: reloadFleet, Duration: 3 * time.Second})
	noErrors(t, row)
}

// TestCappedReloadUnderLoadFailsNothing: a reload under load, with a cap
// the upstream enforces too. The new workers' requests wait for the cap's
// connections, which move and are dialed again as the old workers leave:
// nothing fails, and the upstream never sees more than the cap.
func TestCappedReloadUnderLoadFailsNothing(t *testing.T) {
	s := capped("capped-reload")
	s.During, s.Duration = reloadFleet, 3*time.Second
	row := runOrbit(t, s)
	noErrors(t, row)
	heldTheCap(t, row)
}

// cappedLimit is the capped tests' cap on the fleet's connections to the
// upstream, which the upstream enforces too.
const cappedLimit = 8

// capped is a capped test's scenario: a 2ms upstream that takes at most
// cappedLimit connections, and the fleet capped at as many.
func capped(name string) Scenario {
	return Scenario{
		Name:     name,
		Upstream: upstream.Options{MaxConns: cappedLimit, Delay: 2 * time.Millisecond},
		MaxConns: cappedLimit,
	}
}

// heldTheCap: the upstream never saw more than cappedLimit connections
// open, so it refused none.
func heldTheCap(t *testing.T, row Row) {
	t.Helper()
	if row.Upstream.Peak > cappedLimit || row.Upstream.Refused != 0 {
		t.Fatalf("upstream saw %d connections at peak and refused %d, cap %d", row.Upstream.Peak, row.Upstream.Refused, cappedLimit)
	}
}

// fleetTable is the part of the admin route's answer the tests read.
type fleetTable struct {
	Fleets []struct {
		Members []struct {
			PID int `json:"pid"`
		} `json:"members"`
		Upstreams []struct {
			Live     int `json:"live"`
			InFlight int `json:"in_flight"`
			Pending  int `json:"pending"`
			Waiting  int `json:"waiting"`
			Held     int `json:"held"`
		} `json:"upstreams"`
	} `json:"fleets"`
}

func TestKillUnderLoadRestoresCapacity(t *testing.T) {
	row, _ := runKill(t, Scenario{
		Name:     "kill",
		Upstream: upstream.Options{Delay: 2 * time.Millisecond},
	})
	failedOnlyOnTheKilled(t, row)
}

// TestCappedKillUnderLoadKeepsTheCap: a worker killed under load while a
// cap the upstream enforces too is full. Its share of the cap comes back
// to the fleet only once the kernel has closed its connections and the
// upstream has had reclaim_hold to see the closes, so the upstream never
// sees more than the cap; the survivors' waiting requests are served by
// the reclaimed units, and only the requests on the killed worker's own
// client connections fail.
func TestCappedKillUnderLoadKeepsTheCap(t *testing.T) {
	row, held := runKill(t, capped("capped-kill"))
	heldTheCap(t, row)
	failedOnlyOnTheKilled(t, row)
	sawHeld(t, held)
}

// TestCappedKillOfSlowRequestsKeepsTheCap: as above, with an upstream that
// takes 700ms to answer and, like most servers, counts a connection until
// it has answered the request on it, though the dead worker's end of it
// closed at once. The kill, a second into the load, finds the requests on
// the dead worker's connections 300ms into their 700; the survivors find
// the worker dead within a reconcile interval (250ms), while the upstream
// still counts its connections: had its share of the cap come back then,
// their dials would be refused.
func TestCappedKillOfSlowRequestsKeepsTheCap(t *testing.T) {
	row, held := runKill(t, cappedSlow("capped-kill-slow", 700*time.Millisecond))
	heldTheCap(t, row)
	failedOnlyOnTheKilled(t, row)
	sawHeld(t, held)
}

// TestCappedKillOfRequestsLongerThanTheHold: as above, with answers of 2.5s,
// longer than reclaim_hold (1s). When the hold ends, the upstream still
// counts the dead worker's connections; the host knows (they are orphaned
// in FIN_WAIT2 until the upstream closes), and their units stay held until
// then. The worker that holds them is mostly the one started in the dead
// one's place, which reclaims the dead lane as it joins and may have had no
// request for the upstream when the hold ends: it learns the upstream's
// address from what its siblings wrote. So the upstream refuses no more
// than a few connections, never more than the cap, and no request fails but
// on the killed worker's own clients. With the set time alone, the
// survivors' dials were refused 514 to 891 times a run, and as many
// requests failed; with the kernel followed but the address unknown to the
// new worker, 262 to 543 in 5 runs of 19.
func TestCappedKillOfRequestsLongerThanTheHold(t *testing.T) {
	row, _ := runKill(t, cappedSlow("capped-kill-slower", 2500*time.Millisecond))
	if row.Upstream.Peak > cappedLimit || row.Upstream.Refused > cappedLimit {
		t.Errorf("upstream saw %d connections at peak and refused %d, cap %d", row.Upstream.Peak, row.Upstream.Refused, cappedLimit)
	}
	failedOnlyOnTheKilled(t, row)
}

// cappedSlow is the capped scenario under 16 clients, its upstream
// answering in delay.
func cappedSlow(name string, delay time.Duration) Scenario {
	s := capped(name)
	s.Upstream.Delay = delay
	s.Conns = 16
	return s
}

// sawHeld: after the kill, a surviving worker's admin route showed the dead
// worker's share of the cap held.
func sawHeld(t *testing.T, held int) {
	t.Helper()
	if held == 0 {
		t.Errorf("in the 1.5s after the kill, the admin route never showed a connection held")
	}
}

// TestKillUnderPostLoadFailsOnlyItsOwnClients: a worker killed under a
// load of POSTs, which no one may send again once they may have reached the
// upstream. Its own clients' requests fail, as with the stock transport;
// no surviving worker answers any request with an error, which it would
// for a sibling's POST relayed through the killed worker's connection: a
// POST dials a connection of its own rather than go through a sibling
// while the key's budget allows.
func TestKillUnderPostLoadFailsOnlyItsOwnClients(t *testing.T) {
	row, _ := runKill(t, Scenario{
		Name:     "kill-post",
		Method:   "POST",
		Path:     "/echo",
		Body:     smallBody,
		Upstream: upstream.Options{Delay: 2 * time.Millisecond},
	})
	for kind, n := range row.Load.Errors {
		if strings.HasPrefix(kind, "status ") {
			t.Errorf("a surviving worker answered %d requests with %s", n, kind)
		}
	}
	failedOnlyOnTheKilled(t, row)
}

// runKill runs s for 3s on orbit, killing a second in the worker that owns
// the most upstream connections, and then waits, after the load, until a
// surviving worker sees the fleet whole again: the dead process gone,
// nothing in flight, pending, waiting or held. It also reports the most
// connections a surviving worker's admin route showed held (reclaim_hold)
// in the 1.5s after the kill. Killing worker 0 instead failed a CI run:
// under a cap, where the first dials race, it had won none of the 8 (the
// upstream saw 8 connections in all, against 11 or 12 when the dead worker
// owned some), so nothing was held.
func runKill(t *testing.T, s Scenario) (row Row, held int) {
	t.Helper()
	var killed int
	var table fleetTable
	s.Duration = 3 * time.Second
	s.During = func(ctx context.Context, p Proxy, row *Row) error {
		f := p.(*Fleet)
		time.Sleep(time.Second)
		owned, err := f.owned()
		if err != nil {
			return err
		}
		victim := 0
		for i, n := range owned {
			if n > owned[victim] {
				victim = i
			}
		}
		if killed, err = f.KillWorker(victim); err != nil {
			return err
		}
		row.Notes = append(row.Notes, fmt.Sprintf("killed worker %d (pid %d); the workers owned %v upstream connections", victim, killed, owned))
		witness := (victim + 1) % len(owned)
		read := func() error {
			resp, err := f.Admin(witness, "/orbit_pool/")
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			table = fleetTable{}
			return json.NewDecoder(resp.Body).Decode(&table)
		}
		for end := time.Now().Add(1500 * time.Millisecond); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
			if err := read(); err != nil {
				return err
			}
			for _, fl := range table.Fleets {
				n := 0
				for _, u := range fl.Upstreams {
					n += u.Held
				}
				held = max(held, n)
			}
		}
		time.Sleep(1500 * time.Millisecond)
		deadline := time.Now().Add(5 * time.Second)
		for {
			if err := read(); err != nil {
				return err
			}
			if restored(table, killed) || time.Now().After(deadline) {
				return nil
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	row = runOrbit(t, s)
	if !restored(table, killed) {
		t.Fatalf("fleet not restored after killing pid %d: %+v", killed, table)
	}
	return row, held
}

// failedOnlyOnTheKilled: requests on the killed worker's client
// connections fail; nothing else may, and most requests succeed.
func failedOnlyOnTheKilled(t *testing.T, row Row) {
	t.Helper()
	if n := row.Load.ErrorCount(); n > shortConns {
		t.Fatalf("%d errors, more than the %d client connections: %s", n, shortConns, row.Load.ErrorSummary())
	}
	if row.Load.OK < row.Load.Requests/2 {
		t.Fatalf("only %d of %d requests succeeded", row.Load.OK, row.Load.Requests)
	}
}

func restored(t fleetTable, killed int) bool {
	if len(t.Fleets) != 1 {
		return false
	}
	for _, m := range t.Fleets[0].Members {
		if m.PID == killed {
			return false
		}
	}
	for _, u := range t.Fleets[0].Upstreams {
		if u.InFlight != 0 || u.Pending != 0 || u.Waiting != 0 || u.Held != 0 {
			return false
		}
	}
	return true
}

func TestWebSocketThroughTheFleet(t *testing.T) {
	row := runOrbit(t, Scenario{Name: "websocket", Client: webSocketEcho, Conns: 16})
	noErrors(t, row)
}

func TestLargeBodiesBothWays(t *testing.T) {
	all := Catalogue(shortLoad)
	s, err := Lookup(all, "large")
	if err != nil {
		t.Fatal(err)
	}
	s[0].Conns = 8
	row := runOrbit(t, s[0])
	noErrors(t, row)
}

func TestCaddyfileChangesOnlyTheTransport(t *testing.T) {
	h2 := Caddyfile(Scenario{Upstream: upstream.Options{H2C: true}}, Stock, 8080, "http://127.0.0.1:9000", "/dev/shm/x", "/tmp/s", 4)
	for _, want := range []string{"protocols h1 h2c", "reverse_proxy h2c://127.0.0.1:9000"} {
		if !strings.Contains(h2, want) {
			t.Errorf("h2c config lacks %q:\n%s", want, h2)
		}
	}
	s := Scenario{MaxConns: 16, MaxDialing: 4, Upstream: upstream.Options{TLS: true}}
	orbit := Caddyfile(s, Orbit, 8080, "https://127.0.0.1:9443", "/dev/shm/x", "/tmp/s", 4)
	stock := Caddyfile(s, Stock, 8080, "https://127.0.0.1:9443", "/dev/shm/x", "/tmp/s", 4)
	for _, want := range []string{"transport orbit_pool", "max_conns_per_host 16", "max_dialing_per_host 4", "segment /dev/shm/x", "tls_insecure_skip_verify"} {
		if !strings.Contains(orbit, want) {
			t.Errorf("orbit config lacks %q:\n%s", want, orbit)
		}
	}
	// The stock transport gets the cap split over the workers.
	for _, want := range []string{"transport http", "max_conns_per_host 4", "tls_insecure_skip_verify"} {
		if !strings.Contains(stock, want) {
			t.Errorf("stock config lacks %q:\n%s", want, stock)
		}
	}
	if strings.Contains(stock, "orbit_pool") {
		t.Errorf("stock config names orbit_pool:\n%s", stock)
	}
	// Each orbit variant is orbit's config with its own line, and only that.
	addsOnly := func(cfg, line string) bool {
		return strings.Contains(cfg, line) && strings.Replace(cfg, line, "", 1) == orbit
	}
	if strings.Contains(orbit, "order_window") || strings.Contains(orbit, "policy") {
		t.Errorf("orbit config sets order_window or policy:\n%s", orbit)
	}
	if strict := Caddyfile(s, OrbitStrict, 8080, "https://127.0.0.1:9443", "/dev/shm/x", "/tmp/s", 4); !addsOnly(strict, "\t\torder_window 0\n") {
		t.Errorf("orbit-strict config is not orbit's with order_window 0:\n%s", strict)
	}
	if w16 := Caddyfile(s, OrbitWindow(16), 8080, "https://127.0.0.1:9443", "/dev/shm/x", "/tmp/s", 4); !addsOnly(w16, "\t\torder_window 16\n") {
		t.Errorf("orbit-window-16 config is not orbit's with order_window 16:\n%s", w16)
	}
	if lo := Caddyfile(s, OrbitLocalOnly, 8080, "https://127.0.0.1:9443", "/dev/shm/x", "/tmp/s", 4); !addsOnly(lo, "\t\tpolicy local_only\n") {
		t.Errorf("orbit-local-only config is not orbit's with policy local_only:\n%s", lo)
	}
	capped := Scenario{MaxConns: 16}
	if OrbitLocalOnly.Unfit(capped) == "" || Orbit.Unfit(capped) != "" || OrbitLocalOnly.Unfit(Scenario{}) != "" {
		t.Error("local-only is not left out of exactly the scenarios with a cap")
	}
	if Variant("orbit-window-x").orbit() || Variant("orbit-window--1").orbit() {
		t.Error("a malformed window variant counts as orbit")
	}
	// Stock has room for the load's idle connections; stock-default is
	// Caddy's transport as configured by nothing else.
	def := Caddyfile(Scenario{}, StockDefault, 8080, "http://127.0.0.1:9000", "/dev/shm/x", "/tmp/s", 4)
	if !strings.Contains(Caddyfile(Scenario{}, Stock, 8080, "http://127.0.0.1:9000", "/dev/shm/x", "/tmp/s", 4), "keepalive_idle_conns_per_host 1024") ||
		strings.Contains(def, "keepalive") || !strings.Contains(def, "transport http {") {
		t.Errorf("stock-default config:\n%s", def)
	}
}

// TestDirectHoldsTheCappedConnections: the direct variant is the upstream's
// ceiling, so it must use exactly the capped connections, be refused none,
// and serve at most what they can carry at the upstream's delay.
func TestDirectHoldsTheCappedConnections(t *testing.T) {
	const limit, delay = 4, 2 * time.Millisecond
	s := Scenario{Name: "capped", Upstream: upstream.Options{MaxConns: limit, Delay: delay}, Duration: shortLoad}
	r := &Runner{Dir: t.TempDir()}
	row, err := r.Run(context.Background(), s, Direct)
	if err != nil {
		t.Fatal(err)
	}
	noErrors(t, row)
	if row.Upstream.Accepted != limit || row.Upstream.Refused != 0 {
		t.Fatalf("direct load opened %d connections and was refused %d, cap %d", row.Upstream.Accepted, row.Upstream.Refused, limit)
	}
	if most := int(limit * (row.Load.Elapsed/delay + 1)); row.Load.Requests == 0 || row.Load.Requests > most {
		t.Fatalf("direct load served %d requests in %v: %d connections at %v allow %d", row.Load.Requests, row.Load.Elapsed, limit, delay, most)
	}
	if !strings.Contains(strings.Join(row.Notes, "\n"), "carried a request") {
		t.Fatalf("direct row lacks the upstream's use of its connections: %q", row.Notes)
	}
	s.Upstream.MaxConns = 0
	if _, err := r.Run(context.Background(), s, Direct); err == nil {
		t.Fatal("direct ran on an upstream without a cap")
	}
}

// TestPrintTableSummary: the summary adds up each variant's connections,
// handshakes and errors over the scenarios that ran on both, and names each.
func TestPrintTableSummary(t *testing.T) {
	row := func(name string, v Variant, accepted, handshakes int64, errs int) Row {
		r := Row{Scenario: name, Variant: v}
		r.Upstream.Accepted, r.Upstream.Handshakes = accepted, handshakes
		r.Load.Requests, r.Load.Elapsed = 100, time.Second
		r.Load.Errors = map[string]int{}
		if errs > 0 {
			r.Load.Errors["status 502"] = errs
		}
		return r
	}
	var out strings.Builder
	PrintTable(&out, []Row{
		row("capped", Direct, 16, 0, 0), row("capped", Orbit, 16, 0, 0), row("capped", Stock, 40, 0, 85),
		row("tls-churn", Orbit, 300, 300, 0), row("tls-churn", Stock, 500, 500, 2),
		row("orbit-only", Orbit, 7, 7, 1),
	})
	for _, want := range []string{
		"capped     1.00x the requests/s; upstream connections 16 vs 40; errors 0 vs 85",
		"errors 0 vs 85; p99 0s vs 0s; 100% vs 100% of the requests/s served direct",
		"TLS handshakes 300 vs 500",
		"In all: orbit opened 316 upstream connections where stock opened 540, did 300 TLS handshakes where stock did 500, and failed 0 requests where stock failed 87.",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
}

// TestGRPCOverH2CSharesStreams: gRPC-style unary calls over h2c through
// three workers, 64 client connections with 4 calls each in flight, to an
// upstream that allows 100 streams per connection. Every call succeeds; the
// upstream never has more calls in progress than its connections allow;
// and the fleet, dialing one connection at a time, opens at most one per
// worker beyond what 256 streams need (3), where a stock worker opens its
// own.
func TestGRPCOverH2CSharesStreams(t *testing.T) {
	s, err := Lookup(Catalogue(shortLoad), "grpc")
	if err != nil {
		t.Fatal(err)
	}
	// The upstream holds every call until 101 were in progress at once,
	// one more than a connection carries: the proxies must open a second
	// connection for the load to go on, however slowly a busy machine
	// lets them forward it. Held a second past the load at most, a call
	// still ends well within the client's timeout.
	s[0].Upstream.Gather, s[0].Upstream.GatherWait = 101, shortLoad+time.Second
	row := runOrbit(t, s[0])
	noErrors(t, row)
	u := row.Upstream
	t.Logf("grpc: %d connections, %d streams at peak", u.Accepted, u.PeakStreams)
	if u.PeakStreams > 100*u.Accepted {
		t.Errorf("%d streams at once over %d connections of 100 streams", u.PeakStreams, u.Accepted)
	}
	if u.Accepted > 3+3 {
		t.Errorf("%d upstream connections for %d streams at most at 100 a connection", u.Accepted, u.PeakStreams)
	}
	if u.PeakStreams <= 100 {
		t.Errorf("peak %d streams over %d connections: the proxies did not carry the 101 calls the upstream held for", u.PeakStreams, u.Accepted)
	}
}
