// Package scenario runs orbit's end-to-end scenarios: a fleet of Caddy
// workers in front of the counting upstream, once with the orbit_pool
// transport and once with Caddy's stock http transport under the same load,
// and prints what each cost the upstream side by side.
//
// Everything runs on loopback, bounded in requests and time, and every
// process a run starts is stopped by it.
package scenario

import (
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/orbitproxy/orbit/integration/load"
	"github.com/orbitproxy/orbit/integration/upstream"
	"github.com/orbitproxy/orbit/internal/freeport"
)

// Variant is which transport the fleet's reverse_proxy uses.
type Variant string

// Variants.
const (
	Orbit Variant = "orbit"
	// OrbitStrict is orbit serving waiters in strict arrival order across
	// the fleet (order_window 0): what the default window saves shows
	// under a cap.
	OrbitStrict Variant = "orbit-strict"
	// OrbitLocalOnly is orbit that never uses a sibling's connection
	// (policy local_only): what the remote path costs and saves shows
	// against the default's local_first.
	OrbitLocalOnly Variant = "orbit-local-only"
	Stock          Variant = "stock"
	// StockDefault is the stock transport as Caddy configures it when
	// told nothing: 32 idle connections kept per upstream, so a load of
	// more clients than that closes and opens connections all along.
	// Stock is given room for the whole load instead.
	StockDefault Variant = "stock-default"
	// Direct is no proxy: the load holds the upstream's capped
	// connections itself, one request in flight on each. It measures
	// what the upstream can serve on this machine, the ceiling against
	// which a proxy under the same cap is judged; only for a scenario
	// whose upstream has a cap.
	Direct Variant = "direct"
)

// OrbitWindow is orbit with order_window n, to weigh another window against
// the default's in the same run.
func OrbitWindow(n int) Variant { return Variant(orbitWindowPrefix + strconv.Itoa(n)) }

const orbitWindowPrefix = "orbit-window-"

// window is the order_window v sets, if it sets one.
func (v Variant) window() (int, bool) {
	if v == OrbitStrict {
		return 0, true
	}
	s, ok := strings.CutPrefix(string(v), orbitWindowPrefix)
	if !ok {
		return 0, false
	}
	n, err := strconv.Atoi(s)
	return n, err == nil && n >= 0
}

// orbit reports whether v runs the orbit_pool transport.
func (v Variant) orbit() bool {
	_, windowed := v.window()
	return v == Orbit || v == OrbitLocalOnly || windowed
}

// Unfit says why v cannot run s, or nothing if it can: a scenario whose
// client is not plain HTTP runs only on Caddy fleets, and policy local_only
// takes no fleet-wide cap (the orbit_pool app refuses the two together).
func (v Variant) Unfit(s Scenario) string {
	switch {
	case s.Client != nil && !v.Caddy():
		return "its client is not plain HTTP"
	case v == OrbitLocalOnly && s.MaxConns > 0:
		return "policy local_only takes no max_conns_per_host"
	}
	return ""
}

// Caddy reports whether v is a fleet of Caddy workers, rather than a peer.
func (v Variant) Caddy() bool { return v.orbit() || v == Stock || v == StockDefault }

// Scenario is one situation to put a fleet in.
type Scenario struct {
	Name     string
	Upstream upstream.Options
	// Path, Method and Body make the request. Default GET /.
	Path   string
	Method string
	Body   []byte
	// Conns is the load's concurrency. Default 256.
	Conns int
	// Duration is how long the load runs. Default 5s.
	Duration time.Duration
	// MaxConns caps connections to the upstream: fleet-wide for orbit,
	// split evenly over the workers for the stock transport (the best an
	// operator can do without a shared pool). 0 means no cap.
	MaxConns int
	// MaxDialing caps orbit's concurrent dials per upstream (its creation
	// budget). 0 means no cap.
	MaxDialing int
	// During runs while the load does, from its start; for killing or
	// reloading a worker under load.
	During func(ctx context.Context, p Proxy, row *Row) error
	// Moved is how many bytes one request carries through the proxy,
	// request and response bodies together, when that is what the
	// scenario measures: the summary then gives CPU per MiB.
	Moved int
	// Client replaces the HTTP load, for traffic the load tool does not
	// speak (WebSocket).
	Client func(ctx context.Context, addr string, conns int, d time.Duration) (load.Result, error)
}

// Row is one scenario run on one variant.
type Row struct {
	Scenario string
	Variant  Variant
	Load     load.Result
	Upstream upstream.Stats
	// FirstSecond is the upstream connections accepted in the load's first
	// second: the stampede a cold fleet puts on its upstream.
	FirstSecond int64
	// CPU is the CPU time the proxy's processes used while the load ran;
	// 0 if it could not be read.
	CPU   time.Duration
	Moved int // Scenario.Moved
	// Owned is how many upstream connections each worker owned when the
	// load ended, for orbit under a cap: a worker that owns fewer than
	// its share sends its requests through siblings.
	Owned []int
	// Moves is how many of the connections under a cap orbit closed so
	// that a worker holding fewer dials the replacement: every one the
	// upstream accepted beyond the cap is such a replacement.
	Moves int
	// RelayDials is how many connections orbit's workers dialed because
	// they kept relaying through siblings' connections, which may then sit
	// idle: each may be one more than the load needs at once.
	RelayDials int
	Notes      []string
	// Log is what a fleet printed, read once it stopped: its workers'
	// logs, for a test that failed to show.
	Log   string
	start time.Time // when the load began
}

// CPUPerRequest is the proxy's CPU time per completed request.
func (r Row) CPUPerRequest() time.Duration {
	if r.Load.Requests == 0 {
		return 0
	}
	return r.CPU / time.Duration(r.Load.Requests)
}

// CPUPerMiB is the proxy's CPU time per MiB of bodies it carried, 0 unless
// the scenario says what a request carries.
func (r Row) CPUPerMiB() time.Duration {
	mib := float64(r.Load.Requests) * float64(r.Moved) / (1 << 20)
	if mib == 0 {
		return 0
	}
	return time.Duration(float64(r.CPU) / mib)
}

// Reuse is 1 - new upstream connections / requests.
func (r Row) Reuse() float64 {
	if r.Load.Requests == 0 {
		return 0
	}
	return 1 - float64(r.Upstream.Accepted)/float64(r.Load.Requests)
}

// Runner runs scenarios with one Caddy binary.
type Runner struct {
	Caddy   string // binary with orbit compiled in
	Workers int    // default 4
	// Dir holds the runs' files. Default: a temporary directory.
	Dir string
	// Progress receives the load tool's status lines.
	Progress io.Writer
	// Profiles, if set, is a directory that receives each Caddy worker's
	// CPU profile over the load (from its admin endpoint's pprof), one
	// file per scenario, variant and worker: where a variant's CPU goes.
	Profiles string
}

// Run runs s on variant v and returns what it measured. A scenario that
// could not run is an error; what it measured (errors included) is the row.
func (r *Runner) Run(ctx context.Context, s Scenario, v Variant) (row Row, err error) {
	s = s.withDefaults()
	workers := r.Workers
	if workers <= 0 {
		workers = 4
	}
	dir, err := os.MkdirTemp(r.Dir, "orbit-scenario-*")
	if err != nil {
		return Row{}, err
	}
	defer os.RemoveAll(dir)

	up, err := upstream.Start(s.Upstream)
	if err != nil {
		return Row{}, err
	}
	defer up.Close()
	port, err := freeport.Pick()
	if err != nil {
		return Row{}, err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	var proxy Proxy
	switch {
	case v == Direct:
		if s.Upstream.MaxConns <= 0 || s.Client != nil {
			return Row{}, fmt.Errorf("%s/%s: only a plain HTTP scenario whose upstream has a cap runs without a proxy", s.Name, v)
		}
		addr, s.Conns, s.During = up.Addr, s.Upstream.MaxConns, nil
	case v.Caddy():
		seg := filepath.Join("/dev/shm", fmt.Sprintf("orbit-scenario-%d-%s", os.Getpid(), filepath.Base(dir)))
		defer os.Remove(seg)
		proxy, err = StartFleet(ctx, r.Caddy, Caddyfile(s, v, port, up.URL, seg, filepath.Join(dir, "sock"), workers), workers, dir)
	default:
		proxy, err = startPeer(ctx, v, s, port, up.URL, workers, dir)
	}
	if err != nil {
		return Row{}, fmt.Errorf("%s/%s: %w", s.Name, v, err)
	}
	if proxy != nil {
		defer func() {
			proxy.Stop()
			if f, ok := proxy.(*Fleet); ok {
				row.Log = f.Log()
			}
		}()
	}

	row = Row{Scenario: s.Name, Variant: v, Moved: s.Moved}
	base := up.Stats()
	var firstSecond atomic.Int64
	firstSecond.Store(-1)
	timer := time.AfterFunc(time.Second, func() { firstSecond.Store(up.Stats().Accepted - base.Accepted) })
	defer timer.Stop()
	during := make(chan error, 1)
	cpu0, cpuErr := proxyCPU(proxy)
	row.start = time.Now()
	if s.During != nil {
		go func() { during <- s.During(ctx, proxy, &row) }()
	} else {
		during <- nil
	}
	profiled := make(chan error, 1)
	if f, ok := proxy.(*Fleet); ok && r.Profiles != "" {
		go func() { profiled <- f.profile(r.Profiles, s.Name+"-"+string(v), s.Duration) }()
	} else {
		profiled <- nil
	}
	if s.Client != nil {
		row.Load, err = s.Client(ctx, addr, s.Conns, s.Duration)
	} else {
		row.Load, err = load.Run(ctx, load.Config{
			URL:      "http://" + addr + s.Path,
			Method:   s.Method,
			Body:     s.Body,
			Conns:    s.Conns,
			Duration: s.Duration,
			Timeout:  10 * time.Second,
			Progress: r.Progress,
		})
	}
	if err != nil {
		return row, err
	}
	if cpu1, err := proxyCPU(proxy); err == nil && cpuErr == nil {
		row.CPU = cpu1 - cpu0
	}
	if err := <-during; err != nil {
		return row, fmt.Errorf("%s/%s: %w", s.Name, v, err)
	}
	if err := <-profiled; err != nil {
		// A worker killed under load takes its profile with it.
		row.Notes = append(row.Notes, fmt.Sprintf("not every CPU profile was written: %v", err))
	}
	row.Upstream = up.Stats()
	if m, served := s.Upstream.MaxConns, row.Upstream.Requests-base.Requests; m > 0 && served > 0 {
		// Under a cap every connection has a request waiting for it: the
		// time it carries none is what the proxy takes to hand it on.
		busy := row.Upstream.Busy - base.Busy
		idle := time.Duration(m)*row.Load.Elapsed - busy
		row.Notes = append(row.Notes, fmt.Sprintf("the %d upstream connections carried a request %.1f%% of the time; a request held one %v on average (the delay is %v), and between two requests a connection sat idle %v",
			m, 100*float64(busy)/float64(time.Duration(m)*row.Load.Elapsed), (busy/time.Duration(served)).Round(time.Microsecond), s.Upstream.Delay,
			(idle/time.Duration(served)).Round(time.Microsecond)))
	}
	if f, ok := proxy.(*Fleet); ok && v.orbit() {
		if local, remote, ok := f.reuse(); ok && local+remote > 0 {
			row.Notes = append(row.Notes, fmt.Sprintf("%.1f%% of the requests that reused a connection used a sibling's", 100*remote/(local+remote)))
		}
		if row.RelayDials, err = f.total("caddy_orbit_pool_relay_dials_total"); err != nil {
			return row, fmt.Errorf("%s/%s: %w", s.Name, v, err)
		}
		if row.RelayDials > 0 {
			row.Notes = append(row.Notes, fmt.Sprintf("%d connections dialed by workers that kept relaying through siblings'", row.RelayDials))
		}
		if s.Upstream.MaxConns > 0 {
			// Of the time the upstream saw a connection idle, what the
			// connection spent in its owner's pool: the rest is the
			// response's way to the owner and the next request's to the
			// upstream, through processes that share the machine's CPUs.
			idle, err := f.sum("caddy_orbit_pool_idle_before_reuse_seconds_sum")
			if err != nil {
				return row, fmt.Errorf("%s/%s: %w", s.Name, v, err)
			}
			takes, err := f.sum("caddy_orbit_pool_idle_before_reuse_seconds_count")
			if err != nil {
				return row, fmt.Errorf("%s/%s: %w", s.Name, v, err)
			}
			if takes > 0 {
				row.Notes = append(row.Notes, fmt.Sprintf("of that idle time, %v on average passed in the owner's pool, from an exchange's end to the next request taking the connection",
					time.Duration(idle/takes*float64(time.Second)).Round(time.Microsecond)))
			}
		}
		if s.MaxConns > 0 {
			if row.Owned, err = f.owned(); err != nil {
				return row, fmt.Errorf("%s/%s: %w", s.Name, v, err)
			}
			var passed, held int
			for c, n := range map[string]*int{
				"caddy_orbit_pool_connections_rebalanced_total": &row.Moves,
				"caddy_orbit_pool_dials_passed_total":           &passed,
				"caddy_orbit_pool_dials_held_total":             &held,
			} {
				if *n, err = f.total(c); err != nil {
					return row, fmt.Errorf("%s/%s: %w", s.Name, v, err)
				}
			}
			note := fmt.Sprintf("upstream connections owned by each worker at the end: %v", row.Owned)
			if row.Moves > 0 {
				// What the passes below did not settle: a sibling's
				// request too far back in line, or one that did not
				// wait before a hold ended.
				note += fmt.Sprintf("; %d of the new connections replaced ones that moved to a worker holding fewer", row.Moves)
			}
			if passed > 0 || held > 0 {
				note += fmt.Sprintf("; %d dials passed to a worker holding fewer, and %d held back for one about to wait", passed, held)
			}
			row.Notes = append(row.Notes, note)
		}
	}
	if row.FirstSecond = firstSecond.Load(); row.FirstSecond < 0 { // the load took under a second
		row.FirstSecond = row.Upstream.Accepted - base.Accepted
	}
	return row, nil
}

func (s Scenario) withDefaults() Scenario {
	if s.Path == "" {
		s.Path = "/"
	}
	if s.Method == "" {
		s.Method = "GET"
	}
	if s.Conns <= 0 {
		s.Conns = 256
	}
	if s.Duration <= 0 {
		s.Duration = 5 * time.Second
	}
	return s
}

// Caddyfile is the fleet's configuration for s on variant v: the same site,
// with only the transport changed.
func Caddyfile(s Scenario, v Variant, port int, upstreamURL, segment, sockDir string, workers int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "{\n\tauto_https off\n")
	if s.Upstream.H2C {
		// Clients speak h2c to the fleet, and the fleet to the upstream.
		b.WriteString("\tservers {\n\t\tprotocols h1 h2c\n\t}\n")
		upstreamURL = "h2c://" + strings.TrimPrefix(upstreamURL, "http://")
	}
	if v.orbit() {
		fmt.Fprintf(&b, "\torbit_pool {\n\t\tsegment %s\n\t\tsocket_dir %s\n\t\twait_timeout 10s\n", segment, sockDir)
		if n, ok := v.window(); ok {
			fmt.Fprintf(&b, "\t\torder_window %d\n", n)
		}
		if v == OrbitLocalOnly {
			b.WriteString("\t\tpolicy local_only\n")
		}
		if s.MaxConns > 0 {
			fmt.Fprintf(&b, "\t\tmax_conns_per_host %d\n", s.MaxConns)
		}
		if s.MaxDialing > 0 {
			fmt.Fprintf(&b, "\t\tmax_dialing_per_host %d\n", s.MaxDialing)
		}
		b.WriteString("\t}\n")
	}
	fmt.Fprintf(&b, "}\n\n:%d {\n\tbind 127.0.0.1\n\treverse_proxy %s {\n", port, upstreamURL)
	if v.orbit() {
		b.WriteString("\t\ttransport orbit_pool {\n")
	} else {
		b.WriteString("\t\ttransport http {\n")
		if v == Stock {
			// The stock transport keeps 32 idle connections per host
			// unless told otherwise; give it room for the whole load,
			// so that what the table shows is sharing, not a small
			// idle pool.
			b.WriteString("\t\t\tkeepalive_idle_conns_per_host 1024\n")
		}
		if s.MaxConns > 0 {
			fmt.Fprintf(&b, "\t\t\tmax_conns_per_host %d\n", int(math.Ceil(float64(s.MaxConns)/float64(workers))))
		}
	}
	if s.Upstream.TLS {
		b.WriteString("\t\t\ttls_insecure_skip_verify\n")
	}
	b.WriteString("\t\t}\n\t}\n}\n")
	return b.String()
}

// PrintTable writes rows as one table, with what its columns mean, orbit's
// throughput relative to stock's for each scenario that ran on both, and a
// summary of what orbit saved.
func PrintTable(w io.Writer, rows []Row) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "scenario\tvariant\treq/s\tp50\tp99\terrors\tnew conns\tfirst 1s\tpeak conns\tpeak streams\tTLS hs\treuse\tcpu/req\t")
	for _, r := range rows {
		cpu := "-"
		if r.CPU > 0 {
			cpu = r.CPUPerRequest().Round(time.Microsecond).String()
		}
		fmt.Fprintf(tw, "%s\t%s\t%.0f\t%v\t%v\t%d\t%d\t%d\t%d\t%d\t%d\t%.3f%%\t%s\t\n",
			r.Scenario, r.Variant, r.Load.RPS(), r.Load.P50.Round(10*time.Microsecond), r.Load.P99.Round(10*time.Microsecond),
			r.Load.ErrorCount(), r.Upstream.Accepted, r.FirstSecond, r.Upstream.Peak, r.Upstream.PeakStreams, r.Upstream.Handshakes, 100*r.Reuse(),
			cpu)
	}
	tw.Flush()
	fmt.Fprint(w, `
  req/s       requests answered per second, errors included
  p50, p99    client latency, median and 99th percentile
  errors      requests that failed: a transport error, or a 5xx status
  new conns   TCP connections the upstream accepted (refused ones not counted)
  first 1s    of those, how many in the load's first second: a cold start's stampede
  peak conns  most connections open at the upstream at once
  peak streams  most requests in progress at the upstream at once over HTTP/2
  TLS hs      TLS handshakes the upstream completed
  reuse       share of requests that did not cost the upstream a new connection
  cpu/req     CPU time, user and system, of the proxy's processes per request
`)
	if slices.ContainsFunc(rows, func(r Row) bool { return r.Variant == Direct }) {
		fmt.Fprint(w, `  direct      no proxy: the load holds the upstream's capped connections itself,
              one request on each: what the upstream can serve on this machine
`)
	}
	fmt.Fprintln(w)
	pairs := map[string]map[Variant]Row{}
	var order []string
	for _, r := range rows {
		if pairs[r.Scenario] == nil {
			pairs[r.Scenario] = map[Variant]Row{}
			order = append(order, r.Scenario)
		}
		pairs[r.Scenario][r.Variant] = r
	}
	for _, r := range rows {
		for _, n := range r.Notes {
			fmt.Fprintf(w, "%s/%s: %s\n", r.Scenario, r.Variant, n)
		}
		if r.Load.ErrorCount() > 0 {
			fmt.Fprintf(w, "%s/%s errors: %s\n", r.Scenario, r.Variant, r.Load.ErrorSummary())
		}
	}
	printSummary(w, order, pairs)
}

// printSummary says, scenario by scenario and in total, what orbit saved
// against the stock transport under the same load.
func printSummary(w io.Writer, order []string, pairs map[string]map[Variant]Row) {
	// Totals, orbit's then stock's.
	var conns, handshakes [2]int64
	var errs [2]int
	var lines []string
	for _, name := range order {
		ro, okO := pairs[name][Orbit]
		rs, okS := pairs[name][Stock]
		if !okO || !okS {
			continue
		}
		line := fmt.Sprintf("  %-10s %s the requests/s; upstream connections %d vs %d; errors %d vs %d; p99 %v vs %v",
			name, ratio(ro.Load.RPS(), rs.Load.RPS()), ro.Upstream.Accepted, rs.Upstream.Accepted,
			ro.Load.ErrorCount(), rs.Load.ErrorCount(), ro.Load.P99.Round(100*time.Microsecond), rs.Load.P99.Round(100*time.Microsecond))
		if ro.CPU > 0 && rs.CPU > 0 {
			line += "; CPU per request " + ratio(float64(ro.CPUPerRequest()), float64(rs.CPUPerRequest()))
			if m := ro.CPUPerMiB(); m > 0 {
				line += fmt.Sprintf(" (per MiB of bodies %v vs %v)", m.Round(10*time.Microsecond), rs.CPUPerMiB().Round(10*time.Microsecond))
			}
		}
		if rd, ok := pairs[name][Direct]; ok && rd.Load.RPS() > 0 {
			line += fmt.Sprintf("; %.0f%% vs %.0f%% of the requests/s served direct", 100*ro.Load.RPS()/rd.Load.RPS(), 100*rs.Load.RPS()/rd.Load.RPS())
		}
		if ro.Upstream.Handshakes+rs.Upstream.Handshakes > 0 {
			line += fmt.Sprintf("; TLS handshakes %d vs %d", ro.Upstream.Handshakes, rs.Upstream.Handshakes)
		}
		lines = append(lines, line)
		for i, r := range []Row{ro, rs} {
			conns[i] += r.Upstream.Accepted
			handshakes[i] += r.Upstream.Handshakes
			errs[i] += r.Load.ErrorCount()
		}
	}
	if len(lines) == 0 {
		return
	}
	fmt.Fprintln(w, "\nWhat orbit did against stock (orbit vs stock):")
	for _, l := range lines {
		fmt.Fprintln(w, l)
	}
	fmt.Fprintf(w, "In all: orbit opened %d upstream connections where stock opened %d, did %d TLS handshakes where stock did %d, and failed %d requests where stock failed %d.\n",
		conns[0], conns[1], handshakes[0], handshakes[1], errs[0], errs[1])
}

// ratio is a/b as "1.20x", or "-" when b is 0.
func ratio(a, b float64) string {
	if b == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2fx", a/b)
}
