package caddymodule

import (
	"context"
	"math"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

func TestParseTimeout(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		// gRPC's grpc-timeout.
		{"30m", 30 * time.Millisecond, true},
		{"5S", 5 * time.Second, true},
		{"2M", 2 * time.Minute, true},
		{"1H", time.Hour, true},
		{"250u", 250 * time.Microsecond, true},
		{"7n", 7, true},
		{"0m", 0, true},
		{"99999999H", math.MaxInt64, true}, // saturates: gRPC allows more than a Duration holds
		{"2562047H", 2562047 * time.Hour, true},
		{"123456789m", 0, false}, // nine digits: more than gRPC allows
		{"m", 0, false},
		{"30x", 0, false},
		{"-5S", 0, false},
		{"3 S", 0, false},
		// Seconds.
		{"5", 5 * time.Second, true},
		{"0", 0, true},
		{"0.030", 30 * time.Millisecond, true},
		{"1.5", 1500 * time.Millisecond, true},
		{"0.000000001", 1, true},
		{" 2 ", 2 * time.Second, true},
		{"\t0.5", 500 * time.Millisecond, true},
		{"999999999999", math.MaxInt64, true}, // saturates rather than wraps
		{"1.", 0, false},
		{".5", 0, false},
		{"1.0000000001", 0, false},
		{"1e3", 0, false},
		{"+1", 0, false},
		{"30ms", 0, false}, // Go's syntax: ambiguous with gRPC's "30m", refused
		{"", 0, false},
		{"  ", 0, false},
		{"1,2", 0, false},
		{strings.Repeat("1", 25), 0, false},
	} {
		got, ok := ParseTimeout(tc.in)
		if ok != tc.ok || got != tc.want {
			t.Errorf("ParseTimeout(%q) = %v, %v; want %v, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

// FuzzParseTimeout checks that no header value panics or yields a negative
// timeout, and that what parses is what the two formats say.
//
//	go test -run '^$' -fuzz FuzzParseTimeout -fuzztime 1m ./caddymodule/
func FuzzParseTimeout(f *testing.F) {
	for _, s := range []string{"30m", "5S", "0.030", "1.5", "99999999H", "999999999999.999999999", " 1 ", "1e3", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, ok := ParseTimeout(s)
		if !ok {
			if d != 0 {
				t.Fatalf("ParseTimeout(%q) failed with %v", s, d)
			}
			return
		}
		if d < 0 {
			t.Fatalf("ParseTimeout(%q) = %v", s, d)
		}
		v := strings.Trim(s, " \t")
		if strings.ContainsAny(v, " \t+-eE,") {
			t.Fatalf("ParseTimeout(%q) accepted a value with a sign, exponent or space", s)
		}
		// A plain number of seconds agrees with strconv, to the precision
		// of a float64.
		if f, err := strconv.ParseFloat(v, 64); err == nil && d != math.MaxInt64 {
			if diff := math.Abs(f*1e9 - float64(d)); diff > 1+f*1e9*1e-12 {
				t.Fatalf("ParseTimeout(%q) = %v, strconv says %v seconds", s, d, f)
			}
		}
	})
}

func TestTransportDeadline(t *testing.T) {
	now := time.Now()
	tr := &Transport{DeadlineHeaders: []string{"Request-Timeout", "Grpc-Timeout"}}
	request := func(ctx context.Context, h http.Header) *http.Request {
		r, _ := http.NewRequestWithContext(ctx, "GET", "http://upstream/", nil)
		r.Header = h
		return r
	}
	ctxDL, cancel := context.WithDeadline(context.Background(), now.Add(2*time.Second))
	defer cancel()
	srv := &caddyhttp.Server{WriteTimeout: caddy.Duration(3 * time.Second)}
	withSrv := context.WithValue(context.Background(), caddyhttp.ServerCtxKey, srv)

	for _, tc := range []struct {
		name    string
		ctx     context.Context
		h       http.Header
		timeout time.Duration
		want    time.Duration // after now; 0 with src none
		src     string
	}{
		{"nothing", context.Background(), http.Header{}, 0, 0, DeadlineNone},
		{"context", ctxDL, http.Header{}, 0, 2 * time.Second, DeadlineContext},
		{"header", ctxDL, http.Header{"Request-Timeout": {"0.5"}}, 0, 500 * time.Millisecond, DeadlineHeader},
		{"grpc header", context.Background(), http.Header{"Grpc-Timeout": {"30m"}}, 0, 30 * time.Millisecond, DeadlineHeader},
		{"earliest of two headers", context.Background(), http.Header{"Request-Timeout": {"1"}, "Grpc-Timeout": {"200m"}}, 0, 200 * time.Millisecond, DeadlineHeader},
		{"earliest of two lines", context.Background(), http.Header{"Request-Timeout": {"1", "0.3"}}, 0, 300 * time.Millisecond, DeadlineHeader},
		{"earliest of two lines merged", context.Background(), http.Header{"Request-Timeout": {"1, 0.3"}}, 0, 300 * time.Millisecond, DeadlineHeader},
		{"merged with one unparsable", context.Background(), http.Header{"Request-Timeout": {"soon,0.4"}}, 0, 400 * time.Millisecond, DeadlineHeader},
		{"unparsable header ignored", context.Background(), http.Header{"Request-Timeout": {"soon"}}, time.Second, time.Second, DeadlineTimeout},
		{"header not named", context.Background(), http.Header{"X-Timeout": {"1"}}, 0, 0, DeadlineNone},
		{"timeout earlier than header", context.Background(), http.Header{"Request-Timeout": {"5"}}, time.Second, time.Second, DeadlineTimeout},
		{"write timeout", withSrv, http.Header{}, 4 * time.Second, 3 * time.Second, DeadlineWriteTimeout},
		{"timeout earlier than write timeout", withSrv, http.Header{}, time.Second, time.Second, DeadlineTimeout},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr.Timeout = caddy.Duration(tc.timeout)
			dl, src := tr.deadline(request(tc.ctx, tc.h), now)
			if src != tc.src {
				t.Fatalf("source %q, want %q", src, tc.src)
			}
			if tc.src == DeadlineNone {
				if !dl.IsZero() {
					t.Fatalf("deadline %v without a source", dl)
				}
				return
			}
			if got := dl.Sub(now); got != tc.want {
				t.Fatalf("deadline now+%v, want now+%v", got, tc.want)
			}
		})
	}
}
