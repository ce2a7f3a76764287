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
//
// By default it runs the scenarios where sharing matters most: an upstream
// that refuses connections past 16 (capped), a cold start of 256 clients
// under a creation budget (stampede), and a TLS upstream through reloads and
// a worker's death (tls-churn). A scenario whose upstream has a cap also runs
// without a proxy (direct): the load holds the capped connections itself,
// which measures what the upstream can serve on this machine.
//
// Everything runs on loopback; every process it starts is stopped before it
// exits.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
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
	)
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	variants := []scenario.Variant{scenario.Orbit}
	if *strict {
		variants = append(variants, scenario.OrbitStrict)
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
	if err := run(ctx, *caddy, *workers, *conns, *dur, *names, *all, variants); err != nil {
		fmt.Fprintln(os.Stderr, "orbit-demo:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, caddy string, workers, conns int, d time.Duration, names string, all bool, variants []scenario.Variant) error {
	catalogue := scenario.Catalogue(d)
	list := catalogue
	if !all {
		var err error
		if list, err = scenario.Lookup(catalogue, strings.Split(names, ",")...); err != nil {
			return err
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
	r := &scenario.Runner{Caddy: caddy, Workers: workers, Dir: dir, Progress: os.Stderr}
	var rows []scenario.Row
	for _, s := range list {
		if s.Conns == 0 {
			s.Conns = conns
		}
		vs := variants
		if s.Upstream.MaxConns > 0 && s.Client == nil {
			vs = append([]scenario.Variant{scenario.Direct}, variants...)
		}
		for _, v := range vs {
			if s.Client != nil && !v.Caddy() {
				fmt.Fprintf(os.Stderr, "%s: not run on %s (its client is not plain HTTP)\n", s.Name, v)
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
	fmt.Println()
	scenario.PrintTable(os.Stdout, rows)
	return nil
}
