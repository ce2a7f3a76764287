package load

import (
	"context"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestHistogramQuantiles(t *testing.T) {
	var h histogram
	var samples []time.Duration
	rng := rand.New(rand.NewPCG(1, 2))
	for range 100000 {
		d := time.Duration(rng.ExpFloat64() * float64(time.Millisecond))
		samples = append(samples, d)
		h.record(d)
	}
	slices.Sort(samples)
	for _, q := range []float64{0.5, 0.9, 0.99, 0.999} {
		exact := samples[int(q*float64(len(samples)-1))]
		got := h.quantile(q)
		if diff := float64(got-exact) / float64(exact); diff > 0.02 || diff < -0.02 {
			t.Errorf("p%v: %v, exact %v (%.1f%% off)", q*100, got, exact, diff*100)
		}
	}
	if h.max != samples[len(samples)-1] {
		t.Errorf("max %v, want %v", h.max, samples[len(samples)-1])
	}
	for b := range 57 * 64 { // every bucket a time.Duration can reach
		if bucketOf(lowerBound(b)) != b {
			t.Fatalf("bucket %d: lower bound %v falls in bucket %d", b, lowerBound(b), bucketOf(lowerBound(b)))
		}
	}
}

func TestClosedLoopCountsEverything(t *testing.T) {
	var served atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if served.Add(1)%10 == 0 {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()
	res, err := Run(context.Background(), Config{URL: srv.URL, Conns: 8, Requests: 500, Duration: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if res.Requests != 500 || served.Load() != 500 {
		t.Fatalf("%d requests reported, %d served, want 500", res.Requests, served.Load())
	}
	if res.Status[503] != 50 || res.Errors["status 503"] != 50 || res.OK != 450 || res.ErrorCount() != 50 {
		t.Fatalf("status %v errors %v ok %d", res.Status, res.Errors, res.OK)
	}
	if res.P50 <= 0 || res.P50 > res.P99 || res.P99 > res.Max || res.RPS() <= 0 {
		t.Fatalf("latency p50 %v p99 %v max %v rps %v", res.P50, res.P99, res.Max, res.RPS())
	}
}

func TestOpenLoopKeepsTheRate(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer srv.Close()
	res, err := Run(context.Background(), Config{URL: srv.URL, Conns: 4, Rate: 200, Requests: 100, Duration: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	// 100 requests at 200/s take half a second; starting them all at once
	// (closed loop) would take a few milliseconds.
	if res.Requests != 100 || res.Elapsed < 450*time.Millisecond {
		t.Fatalf("%d requests in %v, want 100 spread over ~500ms", res.Requests, res.Elapsed)
	}
}

func TestOpenLoopCountsQueueingInLatency(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		time.Sleep(20 * time.Millisecond)
	}))
	defer srv.Close()
	// One connection, 200/s offered, 50/s served: requests queue, and the
	// queue shows in the latency rather than being hidden by a slow sender.
	res, err := Run(context.Background(), Config{URL: srv.URL, Conns: 1, Rate: 200, Requests: 40, Duration: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if res.Max < 300*time.Millisecond {
		t.Fatalf("max latency %v: queueing behind a 20ms server was not counted", res.Max)
	}
}

func TestErrorsByKind(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	url := srv.URL
	srv.Close() // nothing listens there now
	res, err := Run(context.Background(), Config{URL: url, Conns: 2, Requests: 10, Duration: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if res.Errors["connection refused"] != 10 || res.OK != 0 {
		t.Fatalf("errors %v, want 10 refused", res.Errors)
	}
	if !strings.Contains(res.ErrorSummary(), "connection refused: 10") {
		t.Fatalf("summary %q", res.ErrorSummary())
	}
}

func TestRefusesTargetsOffThisMachine(t *testing.T) {
	for _, u := range []string{"http://192.0.2.1/", "http://[2001:db8::1]:80/", "https://127.0.0.1/", "http://%zz"} {
		if _, err := Run(context.Background(), Config{URL: u, Requests: 1}); err == nil {
			t.Errorf("%s: accepted", u)
		}
	}
}
