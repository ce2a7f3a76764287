package scenario

import (
	"context"
	"flag"
	"os"
	"testing"
	"time"
)

var longLoad = flag.Duration("scenario.duration", 30*time.Second, "load duration of each scenario in BenchmarkScenarios")

// BenchmarkScenarios is the long, opt-in run: every scenario on orbit and on
// the stock transport, 4 workers and 256 client connections, with the table
// printed at the end and each row's figures reported as metrics.
//
//	go test -run '^$' -bench Scenarios -benchtime 1x ./integration/scenario/ -scenario.duration 60s
func BenchmarkScenarios(b *testing.B) {
	r := &Runner{Caddy: caddyBin, Workers: 4, Dir: shortTempDir(b)}
	var rows []Row
	for _, s := range Catalogue(*longLoad) {
		for _, v := range []Variant{Orbit, Stock} {
			b.Run(s.Name+"/"+string(v), func(b *testing.B) {
				for b.Loop() {
					row, err := r.Run(context.Background(), s, v)
					if err != nil {
						b.Fatal(err)
					}
					rows = append(rows, row)
					b.ReportMetric(row.Load.RPS(), "req/s")
					b.ReportMetric(100*row.Reuse(), "reuse-%")
					b.ReportMetric(float64(row.Upstream.Peak), "peak-conns")
					b.ReportMetric(float64(row.Load.ErrorCount()), "errors")
				}
			})
		}
	}
	PrintTable(os.Stdout, rows)
}
