package caddymodule

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// waitSeries is the upstream label of every wait_duration_seconds series,
// with its count of observations.
func waitSeries(t *testing.T) map[string]uint64 {
	t.Helper()
	ch := make(chan prometheus.Metric, 1<<16)
	localMetrics.wait.Collect(ch)
	close(ch)
	series := make(map[string]uint64)
	for m := range ch {
		var d dto.Metric
		if err := m.Write(&d); err != nil {
			t.Fatal(err)
		}
		for _, l := range d.GetLabel() {
			if l.GetName() == "upstream" {
				series[l.GetValue()] = d.GetHistogram().GetSampleCount()
			}
		}
	}
	return series
}

// dynamicSite starts Caddy with a site whose upstream is the request's
// X-Up header, and returns a function that sends a GET to the upstream it
// is given and returns its status (0 if none came).
func dynamicSite(t *testing.T) func(up string) int {
	port := freePort(t)
	startCaddy(t, "", fmt.Sprintf(`:%d {
	bind 127.0.0.1
	reverse_proxy {http.request.header.X-Up} {
		transport orbit_pool {
			dial_timeout 200ms
		}
	}
}
`, port))
	return func(up string) int {
		req, _ := http.NewRequest("GET", fmt.Sprintf("http://127.0.0.1:%d/", port), nil)
		req.Header.Set("X-Up", up)
		resp, err := client.Do(req)
		if err != nil {
			return 0
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
}

var dynamicRuns atomic.Int64

// TestUnreachableUpstreamsLeaveNoSeries: a dynamic upstream's addresses
// that never gave a request a connection (every dial refused) leave no
// wait_duration_seconds series behind: a series starts with its upstream's
// first wait.
func TestUnreachableUpstreamsLeaveNoSeries(t *testing.T) {
	send := dynamicSite(t)
	const n = 50
	base := int(dynamicRuns.Add(1)-1) * n // addresses new to this process (-count)
	for i := range n {
		// Nothing listens on these ports of 127.0.0.2: the dial is refused.
		send(fmt.Sprintf("127.0.0.2:%d", base+i+1))
	}
	for name := range waitSeries(t) {
		if strings.HasPrefix(name, "http://127.0.0.2:") {
			t.Errorf("an upstream that refused every dial left the series %q", name)
		}
	}
}

// TestTrackedUpstreamsAreBounded: past maxTrackedUpstreams, a transport's
// further upstreams are served and observed under the label "other", not
// under series of their own.
func TestTrackedUpstreamsAreBounded(t *testing.T) {
	old := maxTrackedUpstreams
	maxTrackedUpstreams = 3
	t.Cleanup(func() { maxTrackedUpstreams = old })
	// Counts, not series: an upstream's port may have served an earlier
	// run of the test (-count), whose series stays.
	before := waitSeries(t)
	send := dynamicSite(t)
	var names []string
	for range 6 {
		up := newUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }), false)
		if status := send(up.hostport()); status != http.StatusOK {
			t.Fatalf("upstream %d answered %d", len(names), status)
		}
		names = append(names, "http://"+up.hostport())
	}
	after := waitSeries(t)
	for i, name := range names {
		want := uint64(0)
		if i < 3 {
			want = 1
		}
		if got := after[name] - before[name]; got != want {
			t.Errorf("upstream %d (%s): %d waits observed under its own name, want %d", i, name, got, want)
		}
	}
	if got := after["other"] - before["other"]; got != 3 {
		t.Errorf("%d waits observed under \"other\", want the 3 of the upstreams past the bound", got)
	}
}
