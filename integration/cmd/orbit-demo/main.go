// Command orbit-demo shows what orbit does for a fleet: it builds this
// module's Caddy, starts the demo upstream and a fleet of workers on one
// port, drives the same load through the orbit_pool transport and through
// Caddy's stock http transport, and prints what each cost the upstream.
//
//	go run ./integration/cmd/orbit-demo                  # where sharing matters, 5s each
//	go run ./integration/cmd/orbit-demo -all -d 30s      # every scenario, longer
//	go run ./integration/cmd/orbit-demo -scenarios fast,slow
//	go run ./integration/cmd/orbit-demo -peers           # nginx and HAProxy too, if on PATH
//	go run ./integration/cmd/orbit-demo -stock-default   # and Caddy's stock transport untuned
//	go run ./integration/cmd/orbit-demo -scenarios fast -rounds 5   # ratios over alternating runs
//
// By default it runs the scenarios where sharing matters most: an upstream
// that refuses connections past 16 (capped), a cold start of 256 clients
// under a creation budget (stampede), and a TLS upstream through reloads and
// a worker's death (tls-churn). A scenario whose upstream has a cap also runs
// without a proxy (direct): the load holds the capped connections itself,
// which measures what the upstream can serve on this machine.
//
// On a shared machine one run's ratio of orbit to stock can swing by a
// fifth from the next one's. With -rounds N every scenario runs N times,
// the variants in turn and their order reversed every other round, and the
// summary gives the median and range of orbit's ratios to stock over the
// rounds.
//
// Everything runs on loopback; every process it starts is stopped before it
// exits.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"time"

	"github.com/orbitproxy/orbit/integration/scenario"
)

func main() {
	var (
		caddy   = flag.String("caddy", "", "Caddy binary with orbit (default: build ./cmd/caddy)")
		workers = flag.Int("workers", 4, "workers per fleet")
		conns   = flag.Int("c", 256, "client connections")
		dur     = flag.Duration("d", 5*time.Second, "load duration per scenario and variant")
		names   = flag.String("scenarios", "capped,stampede,tls-churn", "scenarios to run, comma-separated")
		all     = flag.Bool("all", false, "run every scenario")
		peers   = flag.Bool("peers", false, "also run nginx and HAProxy, if on PATH, in the same table")
		defs    = flag.Bool("stock-default", false, "also run the stock transport with Caddy's default idle pool (32 per upstream)")
		strict  = flag.Bool("strict", false, "also run orbit with waiters served in strict arrival order (order_window 0)")
		window  = flag.Int("window", -1, "also run orbit with this order_window, to weigh it against the default")
		local   = flag.Bool("local-only", false, "also run orbit that never uses a sibling's connection (policy local_only)")
		rounds  = flag.Int("rounds", 1, "run every scenario this many times, alternating the variants' order, and summarise orbit's ratios to stock")
		profile = flag.String("cpuprofile", "", "write each Caddy worker's CPU profile over each load to this directory")
	)
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	variants := []scenario.Variant{scenario.Orbit}
	if *strict {
		variants = append(variants, scenario.OrbitStrict)
	}
	if *window >= 0 {
		variants = append(variants, scenario.OrbitWindow(*window))
	}
	if *local {
		variants = append(variants, scenario.OrbitLocalOnly)
	}
	variants = append(variants, scenario.Stock)
	if *defs {
		variants = append(variants, scenario.StockDefault)
	}
	if *peers {
		found := scenario.Peers()
		if len(found) == 0 {
			fmt.Fprintln(os.Stderr, "orbit-demo: -peers: neither nginx nor haproxy is on PATH")
		}
		variants = append(variants, found...)
	}
	if *rounds < 1 {
		fmt.Fprintln(os.Stderr, "orbit-demo: -rounds must be at least 1")
		os.Exit(2)
	}
	if err := run(ctx, *caddy, *workers, *conns, *dur, *names, *all, *rounds, *profile, variants); err != nil {
		fmt.Fprintln(os.Stderr, "orbit-demo:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, caddy string, workers, conns int, d time.Duration, names string, all bool, rounds int, profiles string, variants []scenario.Variant) error {
	catalogue := scenario.Catalogue(d)
	list := catalogue
	if !all {
		var err error
		if list, err = scenario.Lookup(catalogue, strings.Split(names, ",")...); err != nil {
			return err
		}
	}
	if profiles != "" {
		// Made now, so that a path that cannot be one fails before the
		// loads rather than after them.
		if err := os.MkdirAll(profiles, 0o755); err != nil {
			return fmt.Errorf("-cpuprofile: %w", err)
		}
	}
	dir, err := os.MkdirTemp("", "orbit-demo-*")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if caddy == "" {
		fmt.Fprintln(os.Stderr, "building ./cmd/caddy (the first build takes a few minutes)...")
		if caddy, err = scenario.BuildCaddy(ctx, dir); err != nil {
			return err
		}
	}
	r := &scenario.Runner{Caddy: caddy, Workers: workers, Dir: dir, Progress: os.Stderr, Profiles: profiles}
	var rows []scenario.Row
	for round := 1; round <= rounds; round++ {
		for _, s := range list {
			if s.Conns == 0 {
				s.Conns = conns
			}
			vs := variants
			if s.Upstream.MaxConns > 0 && s.Client == nil {
				vs = append([]scenario.Variant{scenario.Direct}, variants...)
			}
			if round%2 == 0 {
				// What runs first may find the machine quieter (or its
				// caches colder) than what runs next.
				vs = slices.Clone(vs)
				slices.Reverse(vs)
			}
			if rounds > 1 {
				// One row per scenario and variant in each round.
				s.Name = fmt.Sprintf("%s#%d", s.Name, round)
			}
			for _, v := range vs {
				if why := v.Unfit(s); why != "" {
					fmt.Fprintf(os.Stderr, "%s: not run on %s (%s)\n", s.Name, v, why)
					continue
				}
				fmt.Fprintf(os.Stderr, "%s, %d workers, %s, %d connections for %v\n", s.Name, workers, v, s.Conns, d)
				row, err := r.Run(ctx, s, v)
				if err != nil {
					return err
				}
				rows = append(rows, row)
			}
		}
	}
	fmt.Println()
	scenario.PrintTable(os.Stdout, rows)
	if rounds > 1 {
		printRounds(os.Stdout, rows)
	}
	return nil
}

// printRounds gives, for each scenario run in several rounds, the median and
// range over the rounds of orbit's requests/s and CPU per request as ratios
// to stock's in the same round.
func printRounds(w io.Writer, rows []scenario.Row) {
	type pair struct{ orbit, stock *scenario.Row }
	byRun := map[string]*pair{}
	var names []string // scenarios, in the order they ran
	for i := range rows {
		r := &rows[i]
		run := r.Scenario
		name, _, _ := strings.Cut(run, "#")
		if byRun[run] == nil {
			byRun[run] = &pair{}
			if !slices.Contains(names, name) {
				names = append(names, name)
			}
		}
		switch r.Variant {
		case scenario.Orbit:
			byRun[run].orbit = r
		case scenario.Stock:
			byRun[run].stock = r
		}
	}
	fmt.Fprintln(w, "\nOrbit against stock over the rounds (median, and range):")
	for _, name := range names {
		var rps, cpu []float64
		for run, p := range byRun {
			if n, _, _ := strings.Cut(run, "#"); n != name || p.orbit == nil || p.stock == nil {
				continue
			}
			if s := p.stock.Load.RPS(); s > 0 {
				rps = append(rps, p.orbit.Load.RPS()/s)
			}
			if s := p.stock.CPUPerRequest(); s > 0 && p.orbit.CPU > 0 {
				cpu = append(cpu, float64(p.orbit.CPUPerRequest())/float64(s))
			}
		}
		if len(rps) == 0 {
			continue
		}
		unit := "rounds"
		if len(rps) == 1 {
			unit = "round"
		}
		fmt.Fprintf(w, "  %-10s %d %s: %s the requests/s", name, len(rps), unit, ratioSpread(rps))
		if len(cpu) > 0 {
			fmt.Fprintf(w, "; CPU per request %s", ratioSpread(cpu))
		}
		fmt.Fprintln(w)
	}
}

// ratioSpread is "1.08x (0.95x to 1.21x)": the median and range of xs.
func ratioSpread(xs []float64) string {
	slices.Sort(xs)
	n := len(xs)
	med := xs[n/2]
	if n%2 == 0 {
		med = (xs[n/2-1] + xs[n/2]) / 2
	}
	return fmt.Sprintf("%.2fx (%.2fx to %.2fx)", med, xs[0], xs[n-1])
}
