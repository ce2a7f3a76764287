package main

import (
	"strings"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/integration/load"
	"github.com/orbitproxy/orbit/integration/scenario"
)

// TestPrintRounds: the summary over rounds pairs orbit with stock of the
// same round only, ignores other variants and rounds where either is
// missing, and gives the median (of an even count, the mean of the middle
// two) and range of the ratios.
func TestPrintRounds(t *testing.T) {
	row := func(name string, v scenario.Variant, reqs int, cpu time.Duration) scenario.Row {
		return scenario.Row{Scenario: name, Variant: v, CPU: cpu,
			Load: load.Result{Requests: reqs, Elapsed: time.Second}}
	}
	rows := []scenario.Row{
		row("fast#1", scenario.Orbit, 1200, 120*time.Millisecond), // 1.20x, CPU 1.00x
		row("fast#1", scenario.Stock, 1000, 100*time.Millisecond),
		row("fast#2", scenario.Stock, 1000, 100*time.Millisecond), // 0.90x, CPU 1.20x
		row("fast#2", scenario.Orbit, 900, 108*time.Millisecond),
		row("fast#3", scenario.Orbit, 1000, 80*time.Millisecond), // 1.00x, CPU 0.80x
		row("fast#3", scenario.StockDefault, 500, 100*time.Millisecond),
		row("fast#3", scenario.Stock, 1000, 100*time.Millisecond),
		row("fast#4", scenario.Orbit, 5000, time.Second), // no stock: left out
		row("capped#1", scenario.Direct, 3000, 0),
		row("capped#1", scenario.Orbit, 2800, 0), // no CPU figures
		row("capped#1", scenario.Stock, 2000, 0),
	}
	var b strings.Builder
	printRounds(&b, rows)
	got := b.String()
	for _, want := range []string{
		"fast       3 rounds: 1.00x (0.90x to 1.20x) the requests/s; CPU per request 1.00x (0.80x to 1.20x)\n",
		"capped     1 round: 1.40x (1.40x to 1.40x) the requests/s\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("summary:\n%s\nwant a line %q", got, want)
		}
	}
	if strings.Index(got, "fast ") > strings.Index(got, "capped ") {
		t.Errorf("scenarios out of the order they ran in:\n%s", got)
	}
	if even := ratioSpread([]float64{1.3, 0.9, 1.1, 1.0}); even != "1.05x (0.90x to 1.30x)" {
		t.Errorf("ratioSpread of four = %q, want the mean of the middle two, 1.05x", even)
	}
}
