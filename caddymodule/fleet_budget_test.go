package caddymodule

import (
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// launchWith writes cfg (the orbit_pool options and site blocks, after the
// fleet's own global options) as f's Caddyfile and starts the fleet.
func launchWith(f *testFleet, opts, sites string) {
	f.t.Helper()
	cfg := fleetGlobals(f.segment, "reconcile_interval 50ms\n\t\t"+opts) + sites
	if err := os.WriteFile(f.caddyfile, []byte(cfg), 0o600); err != nil {
		f.t.Fatal(err)
	}
	f.launch()
}

// metric sums the samples of worker i's metric name whose labels contain
// every one of labels.
func (f *testFleet) metric(i int, name string, labels ...string) float64 {
	f.t.Helper()
	b, err := f.admin(i, "/metrics")
	if err != nil {
		f.t.Fatalf("metrics of worker %d: %v", i, err)
	}
	var sum float64
	re := regexp.MustCompile(`^` + regexp.QuoteMeta(name) + `(\{[^}]*\})? (\S+)$`)
lines:
	for _, line := range strings.Split(string(b), "\n") {
		m := re.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		for _, l := range labels {
			if !strings.Contains(m[1], l) {
				continue lines
			}
		}
		v, _ := strconv.ParseFloat(m[2], 64)
		sum += v
	}
	return sum
}

// fleetSum is metric summed over every worker.
func (f *testFleet) fleetSum(name string, labels ...string) float64 {
	var sum float64
	for i := range f.workers {
		sum += f.metric(i, name, labels...)
	}
	return sum
}

// TestFleetOwnerWithoutRoom: the worker owning the fleet's connections has
// its one budget worker busy. A sibling's lease on its idle connection is
// rejected once the request's deadline comes near (the request is refused by
// its deadline), or once the owner's lease wait ends (the request is retried
// elsewhere and served); never is a lease left to age out, and never does a
// request fail otherwise.
func TestFleetOwnerWithoutRoom(t *testing.T) {
	hold := make(chan struct{})
	var heldBy atomic.Value // worker index the upstream holds a request of
	up := newUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/hold" {
			heldBy.Store(r.Header.Get("X-Sender"))
			// Held until the test ends: each request that reaches the
			// owner without a deadline takes the 2s wait timeout, so the
			// test may run for a while before two reach the sibling.
			select {
			case <-hold:
			case <-time.After(2 * time.Minute):
			}
		}
		io.Copy(io.Discard, r.Body)
		io.WriteString(w, "ok")
	}), false)
	// A second address for the same upstream: another pool key, so that
	// holding a request there holds a worker of the budget but none of
	// the first key's connections.
	up2 := newUpstream(t, up.Config.Handler, false)
	f := newTestFleet(t, 2)
	site := func(port int) string {
		return fmt.Sprintf(`:%d {
	bind 127.0.0.1
	header X-Worker {env.ORBIT_FLEET_WORKER}
	reverse_proxy /hold %s {
		# Each /hold dials a connection of its own and closes it: a
		# sibling's idle one would make the sibling forward it, holding
		# the sibling's worker too.
		transport orbit_pool {
			keepalive off
		}
		header_up X-Sender {env.ORBIT_FLEET_WORKER}
	}
	reverse_proxy %s {
		transport orbit_pool {
			deadline_header Request-Timeout
			max_conns_per_host 2
		}
	}
	handle_errors {
		header X-Worker {env.ORBIT_FLEET_WORKER}
		respond "refused: {vars.orbit_pool_refusal}" {err.status_code}
	}
}
`, port, up2.hostport(), up.hostport())
	}
	launchWith(f, "workers 1\n\t\tdeadline_near_window 250ms\n\t\treservation_timeout 1s\n\t\twait_timeout 2s", site(f.port))
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	// The owner's lease wait is half the reservation timeout, 500ms; the
	// wait timeout leaves a loaded machine room for that and a dial.
	send := func(path string, h http.Header) (status int, worker, body string) {
		req, _ := http.NewRequest("GET", f.url(path), nil)
		for k, v := range h {
			req.Header[k] = v
		}
		start := time.Now()
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		t.Logf("%s %v: worker %s answered %d %q after %v", path, h, resp.Header.Get("X-Worker"), resp.StatusCode, b, time.Since(start).Round(time.Millisecond))
		return resp.StatusCode, resp.Header.Get("X-Worker"), string(b)
	}

	// One connection to the upstream, made by whichever worker the first
	// request reaches: the owner.
	status, owner, _ := send("/", nil)
	if status != 200 || owner == "" {
		t.Fatalf("first request: %d worker %q", status, owner)
	}
	// Hold the owner's one budget worker with a request to the other key,
	// released at the end (requests that reach the other worker are let
	// go at once: its worker must stay free).
	held := make(chan int, 64)
	defer close(hold)
	for try := 0; ; try++ {
		if try == 40 {
			t.Fatalf("no /hold request reached worker %s", owner)
		}
		heldBy.Store("")
		go func() {
			// No client timeout: the request is held as long as the
			// test needs it.
			hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
			resp, err := hc.Get(f.url("/hold"))
			if err != nil {
				held <- 0
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			held <- resp.StatusCode
		}()
		waitFor(t, 5*time.Second, "the upstream to hold a request", func() bool { return heldBy.Load() != "" })
		if heldBy.Load() == owner {
			break
		}
		hold <- struct{}{}
		<-held
	}
	sibling := "0"
	if owner == "0" {
		sibling = "1"
	}
	oi, _ := strconv.Atoi(owner)

	// Requests reaching the sibling ask for the owner's idle connection.
	// With a deadline of 600ms: the owner waits for its worker until the
	// deadline is 250ms off (before its 500ms lease wait ends), rejects,
	// and the sibling refuses the request as deadline_near; the window
	// leaves a loaded machine time to pass the rejection on before the
	// deadline itself passes. Requests reaching the owner wait for its
	// worker and are refused the same way.
	var sibDeadline, sibServed int
	for try := 0; try < 40 && (sibDeadline < 2 || sibServed < 2); try++ {
		if sibDeadline < 2 {
			status, w, body := send("/", http.Header{"Request-Timeout": {"0.6"}})
			if status != 503 || body != "refused: deadline_near" {
				t.Fatalf("with a deadline, worker %s answered %d %q; want 503 deadline_near", w, status, body)
			}
			if w == sibling {
				sibDeadline++
			}
			continue
		}
		// Without a deadline the owner rejects after its lease wait
		// (half the 1s reservation timeout); the sibling then dials its
		// own connection, the fleet's second, and serves the request.
		start := time.Now()
		status, w, body := send("/", nil)
		if w != sibling {
			if status != 503 || body != "refused: wait_timeout" {
				t.Fatalf("owner without a free worker answered %d %q; want 503 wait_timeout", status, body)
			}
			continue
		}
		if status != 200 {
			t.Fatalf("the sibling answered %d %q after %v; want the request retried elsewhere and served", status, body, time.Since(start))
		}
		sibServed++
	}
	if sibDeadline < 2 || sibServed < 2 {
		t.Fatalf("only %d deadline refusals and %d served requests reached the sibling", sibDeadline, sibServed)
	}
	if n := f.metric(oi, "caddy_orbit_pool_leases_refused_total", `reason="deadline"`); n < 2 {
		t.Errorf("the owner rejected %v leases for their deadline; want at least 2", n)
	}
	if n := f.metric(oi, "caddy_orbit_pool_leases_refused_total", `reason="busy"`); n < 1 {
		t.Errorf("the owner rejected %v leases as busy; want at least 1", n)
	}
	if n := f.metric(oi, "caddy_orbit_pool_leases_refused_total", `reason="stale"`); n != 0 {
		t.Errorf("%v leases were stale", n)
	}
	if n := f.metric(oi, "caddy_orbit_pool_fleet_reservations_aged_total"); n != 0 {
		t.Errorf("%v reservations aged out; every rejected lease should have been given back", n)
	}
}

var (
	uploadCount = flag.Int("orbit.uploads", 16, "TestFleetUploadMemoryBound: concurrent uploads")
	uploadMiB   = flag.Int("orbit.upload-mib", 16, "TestFleetUploadMemoryBound: size of each upload in MiB")
)

// patternBody is n bytes of a pattern, made as they are read.
type patternBody struct{ left int64 }

func (b *patternBody) Read(p []byte) (int, error) {
	if b.left <= 0 {
		return 0, io.EOF
	}
	n := int(min(int64(len(p)), b.left))
	for i := range n {
		p[i] = byte('a' + i%26)
	}
	b.left -= int64(n)
	return n, nil
}

// procKiB reads a "Name:   123 kB" line of /proc/pid/status.
func procKiB(t *testing.T, pid int, name string) int64 {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "status"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, name+":"); ok {
			n, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return n
		}
	}
	t.Fatalf("no %s in /proc/%d/status", name, pid)
	return 0
}

// TestFleetUploadMemoryBound: concurrent large uploads through a fleet of two
// with memory_limit 4MiB all complete, many of them through the sibling that
// owns the connection, and neither worker's peak RSS grows by more than a
// fraction of one upload: bodies stream through the budget's buffers, never
// whole. The default is 16 uploads of 16 MiB; the figure in
// the README comes from
//
//	go test -run TestFleetUploadMemoryBound -v ./caddymodule/ -orbit.uploads 64 -orbit.upload-mib 100
func TestFleetUploadMemoryBound(t *testing.T) {
	size := int64(*uploadMiB) << 20
	var got sync.Map // request id -> bytes the upstream read
	up := newUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, err := io.Copy(io.Discard, r.Body)
		if err != nil {
			w.WriteHeader(500)
			return
		}
		got.Store(r.URL.Query().Get("id"), n)
		fmt.Fprint(w, n)
	}), false)
	f := newTestFleet(t, 2)
	// Half as many connections as uploads: the rest wait for one to come
	// free, anywhere in the fleet, and many of them then use a sibling's.
	launchWith(f, fmt.Sprintf("workers 256\n\t\tmemory_limit 4MiB\n\t\twait_timeout 10m\n\t\tmax_conns_per_host %d", max(*uploadCount/2, 1)), fmt.Sprintf(`:%d {
	bind 127.0.0.1
	reverse_proxy %s {
		transport orbit_pool
	}
}
`, f.port, up.hostport()))
	pids := []int{f.workerPID(0), f.workerPID(1)}
	var before [2]int64
	for i, pid := range pids {
		before[i] = procKiB(t, pid, "VmHWM")
	}

	c := &http.Client{Timeout: 5 * time.Minute, Transport: &http.Transport{DisableKeepAlives: true}}
	start := time.Now()
	var peakReserved atomic.Int64
	stop := make(chan struct{})
	go func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			for i := range 2 {
				if b, err := f.admin(i, "/metrics"); err == nil {
					m := regexp.MustCompile(`(?m)^caddy_orbit_pool_budget_memory_reserved_bytes (\S+)$`).FindSubmatch(b)
					if m != nil {
						v, _ := strconv.ParseFloat(string(m[1]), 64)
						for cur := peakReserved.Load(); int64(v) > cur && !peakReserved.CompareAndSwap(cur, int64(v)); cur = peakReserved.Load() {
						}
					}
				}
			}
		}
	}()
	// A batch's uploads may, on a loaded machine, all find connections of
	// their own worker; another batch then gives the sibling path its turn.
	var served float64
	rounds := 0
	for rounds < 3 && served == 0 {
		rounds++
		got.Clear()
		errs := make(chan error, *uploadCount)
		var wg sync.WaitGroup
		for i := range *uploadCount {
			wg.Go(func() {
				req, _ := http.NewRequest("POST", f.url(fmt.Sprintf("/up?id=%d", i)), &patternBody{left: size})
				req.ContentLength = size
				resp, err := c.Do(req)
				if err != nil {
					errs <- fmt.Errorf("upload %d: %w", i, err)
					return
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 || string(b) != strconv.FormatInt(size, 10) {
					errs <- fmt.Errorf("upload %d: %d %q", i, resp.StatusCode, b)
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		n := 0
		got.Range(func(_, v any) bool {
			if v.(int64) == size {
				n++
			}
			return true
		})
		if n != *uploadCount {
			t.Errorf("round %d: the upstream received %d whole uploads of %d", rounds, n, *uploadCount)
		}
		served = f.fleetSum("caddy_orbit_pool_served_remote_total")
	}
	close(stop)
	took := time.Since(start)
	if served == 0 {
		t.Errorf("no upload went through a sibling in %d rounds", rounds)
	}
	total := float64(rounds) * float64(*uploadCount) * float64(size) / (1 << 20)
	for i, pid := range pids {
		peak, rss := procKiB(t, pid, "VmHWM"), procKiB(t, pid, "VmRSS")
		grew := peak - before[i]
		t.Logf("worker %d: peak RSS %d KiB (%d KiB before the uploads, +%d KiB), RSS now %d KiB", i, peak, before[i], grew, rss)
		// A single upload buffered whole would be size; all of them,
		// many times that.
		if limit := int64(64 << 10); grew > limit {
			t.Errorf("worker %d's peak RSS grew by %d KiB for %.0f MiB of uploads; want under %d KiB", i, grew, total, limit)
		}
	}
	t.Logf("%d round(s) of %d uploads of %d MiB in %v (%.0f MiB/s), %v through a sibling; peak budget memory reserved %d KiB (limit 4096 KiB)",
		rounds, *uploadCount, *uploadMiB, took.Round(time.Millisecond), total/took.Seconds(), served, peakReserved.Load()>>10)
}
