package caddymodule

import (
	"context"
	"math"
	"net/http"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// Where a request's deadline came from, as the placeholder
// {http.vars.orbit_pool_deadline_source} and the deadline_source label of
// caddy_orbit_pool_deadlines_total show it.
const (
	// DeadlineNone: no deadline; the request waits up to wait_timeout and
	// its exchange is bounded by nothing of the transport's, as before.
	DeadlineNone = "none"
	// DeadlineContext: the request's context already had the earliest
	// deadline (set by a handler or server in front of reverse_proxy).
	DeadlineContext = "context"
	// DeadlineHeader: a header named by deadline_header.
	DeadlineHeader = "header"
	// DeadlineTimeout: the transport's timeout option.
	DeadlineTimeout = "timeout"
	// DeadlineWriteTimeout: the server's write_timeout.
	DeadlineWriteTimeout = "write_timeout"
)

// VarDeadlineSource is the name of the variable holding the deadline's
// source: {http.vars.orbit_pool_deadline_source}.
const VarDeadlineSource = "orbit_pool_deadline_source"

// deadline is the request's deadline, the earliest of its context's, the
// deadline headers', the transport's timeout and the server's write timeout,
// with the source it came from; a tie goes to the first in that order. now
// is when the transport received the request: the timeouts count from it,
// which is a little after the server started its own write timeout clock, so
// that a server write timeout still fires on its own.
func (t *Transport) deadline(req *http.Request, now time.Time) (time.Time, string) {
	var dl time.Time
	src := DeadlineNone
	consider := func(d time.Time, s string) {
		if dl.IsZero() || d.Before(dl) {
			dl, src = d, s
		}
	}
	if d, ok := req.Context().Deadline(); ok {
		consider(d, DeadlineContext)
	}
	for _, name := range t.DeadlineHeaders {
		for _, line := range req.Header.Values(name) {
			// A proxy in front may have merged repeated lines into
			// one, comma-separated: each value counts, as each line does.
			for v := range strings.SplitSeq(line, ",") {
				if d, ok := ParseTimeout(strings.TrimSpace(v)); ok {
					consider(addDuration(now, d), DeadlineHeader)
				}
			}
		}
	}
	if t.Timeout > 0 {
		consider(now.Add(time.Duration(t.Timeout)), DeadlineTimeout)
	}
	if srv, ok := req.Context().Value(caddyhttp.ServerCtxKey).(*caddyhttp.Server); ok && srv.WriteTimeout > 0 {
		consider(now.Add(time.Duration(srv.WriteTimeout)), DeadlineWriteTimeout)
	}
	return dl, src
}

// addDuration is t+d, saturating instead of wrapping for a huge d.
func addDuration(t time.Time, d time.Duration) time.Time {
	const far = 100 * 365 * 24 * time.Hour
	return t.Add(min(d, far))
}

// ParseTimeout reads a deadline header's value: how long the client will
// wait for the answer. Two forms are understood:
//
//   - gRPC's grpc-timeout: one to eight ASCII digits and a unit, H (hours),
//     M (minutes), S (seconds), m (milliseconds), u (microseconds) or n
//     (nanoseconds): "30m" is 30 milliseconds, "5S" five seconds;
//   - a number of seconds, as Request-Timeout headers carry it: one to
//     twelve digits, optionally with a fraction of up to nine: "5", "0.030".
//
// Anything else (a sign, spaces inside, Go's "30ms", an empty value) is not
// a timeout and reports false; the request then has no deadline from that
// header. Surrounding spaces and tabs are ignored.
func ParseTimeout(v string) (time.Duration, bool) {
	v = strings.Trim(v, " \t") // optional whitespace around a field value
	if v == "" || len(v) > 24 {
		return 0, false
	}
	if d, ok := parseGRPCTimeout(v); ok {
		return d, true
	}
	return parseSeconds(v)
}

// digits parses s, all ASCII digits, at most 18 of them; ok is false for
// anything else.
func digits(s string) (n int64, ok bool) {
	if s == "" || len(s) > 18 {
		return 0, false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	return n, true
}

var grpcUnits = map[byte]time.Duration{
	'H': time.Hour,
	'M': time.Minute,
	'S': time.Second,
	'm': time.Millisecond,
	'u': time.Microsecond,
	'n': time.Nanosecond,
}

func parseGRPCTimeout(v string) (time.Duration, bool) {
	unit, ok := grpcUnits[v[len(v)-1]]
	if !ok || len(v) < 2 || len(v) > 9 {
		return 0, false
	}
	n, ok := digits(v[:len(v)-1])
	if !ok {
		return 0, false
	}
	return mulSaturating(n, unit), true
}

func parseSeconds(v string) (time.Duration, bool) {
	whole, frac := v, ""
	for i := 0; i < len(v); i++ {
		if v[i] == '.' {
			whole, frac = v[:i], v[i+1:]
			if frac == "" {
				return 0, false
			}
			break
		}
	}
	if len(whole) > 12 || len(frac) > 9 {
		return 0, false
	}
	s, ok := digits(whole)
	if !ok {
		return 0, false
	}
	d := mulSaturating(s, time.Second)
	if frac != "" {
		f, ok := digits(frac)
		if !ok {
			return 0, false
		}
		for range 9 - len(frac) {
			f *= 10
		}
		if d > math.MaxInt64-time.Duration(f) {
			return math.MaxInt64, true
		}
		d += time.Duration(f)
	}
	return d, true
}

func mulSaturating(n int64, unit time.Duration) time.Duration {
	if n > math.MaxInt64/int64(unit) {
		return math.MaxInt64
	}
	return time.Duration(n) * unit
}

// withDeadline is ctx bounded by dl, or ctx itself when dl is zero or no
// earlier than ctx's own deadline.
func withDeadline(ctx context.Context, dl time.Time) (context.Context, context.CancelFunc) {
	if dl.IsZero() {
		return ctx, func() {}
	}
	if cur, ok := ctx.Deadline(); ok && !dl.Before(cur) {
		return ctx, func() {}
	}
	return context.WithDeadline(ctx, dl)
}
