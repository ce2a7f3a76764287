// Package load drives HTTP load at a server on this machine and reports what
// it saw: requests per second, latency percentiles and errors by kind. It is
// the measuring end of orbit's scenarios and of the fleet demo.
//
// A run is bounded by a request count and a duration, and refuses any target
// that is not a loopback address: it is a tool for measuring a fleet on this
// host, never for loading somebody else's.
package load

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"
)

// Config describes one run.
type Config struct {
	// URL is the target: http, on a loopback address.
	URL string
	// Method is the request method. Default GET.
	Method string
	// Body is sent with every request.
	Body []byte
	// Header is added to every request.
	Header map[string]string
	// Conns is how many connections the client keeps, and in closed-loop mode
	// how many requests are in flight. Default 64.
	Conns int
	// Rate, when positive, selects open-loop mode: requests are started at
	// this many per second whether or not earlier ones have finished (up to
	// Conns in flight), and latency counts from when a request was due, so a
	// stalled server cannot hide its queue.
	Rate float64
	// Requests stops the run after this many requests. 0 means no count.
	Requests int
	// Duration stops the run after this long. Default 10s; a run always has
	// one of the two bounds.
	Duration time.Duration
	// Timeout bounds each request. Default 5s.
	Timeout time.Duration
	// Progress, if set, receives a status line every second.
	Progress io.Writer
}

// Result is what a run saw.
type Result struct {
	Requests int            // completed, successfully or not
	OK       int            // answered with a status below 500
	Errors   map[string]int // failures by kind: a transport error or "status 5xx"
	Status   map[int]int    // responses by status
	Elapsed  time.Duration
	P50, P90 time.Duration
	P99, Max time.Duration
}

// RPS is completed requests per second.
func (r Result) RPS() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Requests) / r.Elapsed.Seconds()
}

// ErrorCount is the number of failed requests.
func (r Result) ErrorCount() int {
	n := 0
	for _, c := range r.Errors {
		n += c
	}
	return n
}

// ErrorSummary lists the failures by kind, most frequent first.
func (r Result) ErrorSummary() string {
	if len(r.Errors) == 0 {
		return "none"
	}
	kinds := make([]string, 0, len(r.Errors))
	for k := range r.Errors {
		kinds = append(kinds, k)
	}
	sort.Slice(kinds, func(i, j int) bool { return r.Errors[kinds[i]] > r.Errors[kinds[j]] })
	var b strings.Builder
	for i, k := range kinds {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s: %d", k, r.Errors[k])
	}
	return b.String()
}

func (c *Config) setDefaults() error {
	if c.Method == "" {
		c.Method = "GET"
	}
	if c.Conns <= 0 {
		c.Conns = 64
	}
	if c.Duration <= 0 {
		c.Duration = 10 * time.Second
	}
	if c.Timeout <= 0 {
		c.Timeout = 5 * time.Second
	}
	if c.Rate < 0 {
		return fmt.Errorf("load: rate %v is negative", c.Rate)
	}
	return nil
}

// CheckLoopback refuses a target that is not on this machine.
func CheckLoopback(rawURL string) (*url.URL, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("load: target %q: %w", rawURL, err)
	}
	if u.Scheme != "http" {
		return nil, fmt.Errorf("load: target %q: only http is supported", rawURL)
	}
	host := u.Hostname()
	ips, err := net.LookupIP(host)
	if err != nil {
		return nil, fmt.Errorf("load: target %q: %w", rawURL, err)
	}
	for _, ip := range ips {
		if !ip.IsLoopback() {
			return nil, fmt.Errorf("load: target %q resolves to %v, not a loopback address; this tool only loads servers on this machine", rawURL, ip)
		}
	}
	return u, nil
}

// Run drives load at cfg.URL until cfg.Requests are done, cfg.Duration
// has passed, or ctx ends.
func Run(ctx context.Context, cfg Config) (Result, error) {
	if err := cfg.setDefaults(); err != nil {
		return Result{}, err
	}
	u, err := CheckLoopback(cfg.URL)
	if err != nil {
		return Result{}, err
	}
	client := &fasthttp.HostClient{
		Addr:                          u.Host,
		MaxConns:                      cfg.Conns,
		ReadTimeout:                   cfg.Timeout,
		WriteTimeout:                  cfg.Timeout,
		MaxIdleConnDuration:           time.Minute,
		NoDefaultUserAgentHeader:      true,
		DisableHeaderNamesNormalizing: true,
	}
	defer client.CloseIdleConnections()

	ctx, cancel := context.WithTimeout(ctx, cfg.Duration)
	defer cancel()
	r := &run{cfg: cfg, client: client, uri: u.String(), start: time.Now()}
	if cfg.Requests > 0 {
		r.budget.Store(int64(cfg.Requests))
	} else {
		r.budget.Store(1 << 62)
	}
	stopProgress := r.progress(ctx)
	if cfg.Rate > 0 {
		r.openLoop(ctx)
	} else {
		r.closedLoop(ctx)
	}
	stopProgress()
	return r.result(), nil
}

type run struct {
	cfg    Config
	client *fasthttp.HostClient
	uri    string
	start  time.Time
	budget atomic.Int64 // requests left to start
	done   atomic.Int64
	failed atomic.Int64

	mu      sync.Mutex
	hist    histogram
	errors  map[string]int
	status  map[int]int
	elapsed time.Duration
}

// worker is one goroutine's tally, merged at the end so that the hot loop
// takes no lock.
type worker struct {
	hist   histogram
	errors map[string]int
	status map[int]int
}

func (r *run) newWorker() *worker {
	return &worker{errors: map[string]int{}, status: map[int]int{}}
}

func (r *run) take() bool { return r.budget.Add(-1) >= 0 }

func (r *run) closedLoop(ctx context.Context) {
	var wg sync.WaitGroup
	for range r.cfg.Conns {
		wg.Go(func() {
			w := r.newWorker()
			for ctx.Err() == nil && r.take() {
				r.do(w, time.Now())
			}
			r.merge(w)
		})
	}
	wg.Wait()
	r.elapsed = time.Since(r.start)
}

func (r *run) openLoop(ctx context.Context) {
	due := make(chan time.Time, r.cfg.Conns)
	var wg sync.WaitGroup
	for range r.cfg.Conns {
		wg.Go(func() {
			w := r.newWorker()
			for t := range due {
				r.do(w, t)
			}
			r.merge(w)
		})
	}
	interval := time.Duration(float64(time.Second) / r.cfg.Rate)
	next := time.Now()
	for ctx.Err() == nil && r.take() {
		if d := time.Until(next); d > 0 {
			select {
			case <-time.After(d):
			case <-ctx.Done():
			}
		}
		select {
		case due <- next:
		case <-ctx.Done():
		}
		next = next.Add(interval)
	}
	close(due)
	wg.Wait()
	r.elapsed = time.Since(r.start)
}

// do sends one request; its latency counts from due.
func (r *run) do(w *worker, due time.Time) {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(r.uri)
	req.Header.SetMethod(r.cfg.Method)
	for k, v := range r.cfg.Header {
		req.Header.Set(k, v)
	}
	if r.cfg.Body != nil {
		req.SetBody(r.cfg.Body)
	}
	err := r.client.DoTimeout(req, resp, r.cfg.Timeout)
	w.hist.record(time.Since(due))
	r.done.Add(1)
	switch {
	case err != nil:
		w.errors[errorKind(err)]++
		r.failed.Add(1)
	case resp.StatusCode() >= 500:
		w.status[resp.StatusCode()]++
		w.errors[fmt.Sprintf("status %d", resp.StatusCode())]++
		r.failed.Add(1)
	default:
		w.status[resp.StatusCode()]++
	}
}

func (r *run) merge(w *worker) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.errors == nil {
		r.errors, r.status = map[string]int{}, map[int]int{}
	}
	r.hist.merge(&w.hist)
	for k, n := range w.errors {
		r.errors[k] += n
	}
	for k, n := range w.status {
		r.status[k] += n
	}
}

func (r *run) result() Result {
	res := Result{
		Requests: int(r.hist.n),
		Errors:   r.errors,
		Status:   r.status,
		Elapsed:  r.elapsed,
		P50:      r.hist.quantile(0.50),
		P90:      r.hist.quantile(0.90),
		P99:      r.hist.quantile(0.99),
		Max:      r.hist.max,
	}
	for code, n := range r.status {
		if code < 500 {
			res.OK += n
		}
	}
	return res
}

// progress prints a status line every second until the returned func runs.
func (r *run) progress(ctx context.Context) func() {
	if r.cfg.Progress == nil {
		return func() {}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		last, lastAt := int64(0), r.start
		for {
			select {
			case <-done:
				fmt.Fprintln(r.cfg.Progress)
				return
			case now := <-t.C:
				n := r.done.Load()
				fmt.Fprintf(r.cfg.Progress, "\r%5.1fs  %9d requests  %8.0f req/s  %d errors   ",
					now.Sub(r.start).Seconds(), n, float64(n-last)/now.Sub(lastAt).Seconds(), r.failed.Load())
				last, lastAt = n, now
			}
		}
	})
	return func() { close(done); wg.Wait() }
}

// errorKind names a transport failure for the report.
func errorKind(err error) string {
	switch {
	case errors.Is(err, fasthttp.ErrTimeout), errors.Is(err, os.ErrDeadlineExceeded):
		return "timeout"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.Is(err, syscall.ECONNRESET):
		return "connection reset"
	case errors.Is(err, fasthttp.ErrConnectionClosed), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "connection closed"
	case errors.Is(err, fasthttp.ErrNoFreeConns):
		return "no free connections"
	}
	return "other"
}
