// Command orbit-load drives HTTP load at a server on this machine and prints
// requests per second, latency percentiles and errors by kind.
//
//	orbit-load -url http://127.0.0.1:8080/ -c 256 -d 10s
//	orbit-load -url http://127.0.0.1:8080/ -rate 5000 -n 50000
//
// Closed loop (the default) keeps -c requests in flight; -rate switches to
// open loop, starting requests on schedule and counting latency from when
// each was due. Only loopback targets are accepted.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"time"

	"github.com/orbitproxy/orbit/integration/load"
)

func main() {
	var (
		cfg    load.Config
		header string
		body   int
	)
	flag.StringVar(&cfg.URL, "url", "", "target URL (http, loopback only)")
	flag.StringVar(&cfg.Method, "method", "GET", "request method")
	flag.IntVar(&body, "body", 0, "request body size in bytes")
	flag.StringVar(&header, "H", "", "extra header, as Name: value")
	flag.IntVar(&cfg.Conns, "c", 64, "connections (closed loop: requests in flight)")
	flag.Float64Var(&cfg.Rate, "rate", 0, "requests per second (open loop); 0 means closed loop")
	flag.IntVar(&cfg.Requests, "n", 0, "stop after this many requests (0: no count)")
	flag.DurationVar(&cfg.Duration, "d", 10*time.Second, "stop after this long")
	flag.DurationVar(&cfg.Timeout, "timeout", 5*time.Second, "per-request timeout")
	flag.Parse()
	if cfg.URL == "" {
		fmt.Fprintln(os.Stderr, "orbit-load: -url is required")
		flag.Usage()
		os.Exit(2)
	}
	if header != "" {
		name, value, ok := strings.Cut(header, ":")
		if !ok {
			fmt.Fprintf(os.Stderr, "orbit-load: -H %q: want Name: value\n", header)
			os.Exit(2)
		}
		cfg.Header = map[string]string{strings.TrimSpace(name): strings.TrimSpace(value)}
	}
	if body > 0 {
		cfg.Body = make([]byte, body)
	}
	cfg.Progress = os.Stderr

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	res, err := load.Run(ctx, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "orbit-load:", err)
		os.Exit(1)
	}
	fmt.Printf("requests  %d in %v (%.0f req/s)\n", res.Requests, res.Elapsed.Round(time.Millisecond), res.RPS())
	fmt.Printf("latency   p50 %v  p90 %v  p99 %v  max %v\n", res.P50, res.P90, res.P99, res.Max)
	fmt.Printf("status    %v\n", res.Status)
	fmt.Printf("errors    %s\n", res.ErrorSummary())
	if res.ErrorCount() > 0 {
		os.Exit(1)
	}
}
