package caddymodule

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/orbitproxy/orbit/backpressure"
	"github.com/orbitproxy/orbit/orbitpool"
	"github.com/orbitproxy/orbit/proxy"
)

// Refusal reasons beyond backpressure's (saturated, draining,
// deadline_near, deadline_elapsed, client_canceled), for logs, metrics and
// {http.vars.orbit_pool_refusal}: a wait for a connection that reached
// wait_timeout, labelled by what the pool lacked; a wait for a permit or a
// worker that reached it; a policy that declined; the admission backstop;
// an owner with no room in time.
const (
	ReasonBusy        = "busy"         // every connection of the upstream was in use until wait_timeout
	ReasonBudget      = "budget"       // the upstream's max_conns_per_host was reached until wait_timeout
	ReasonCreating    = "creating"     // the upstream's max_dialing_per_host was reached until wait_timeout
	ReasonWaitTimeout = "wait_timeout" // no back-pressure permit or budget worker came free within wait_timeout
	ReasonPolicy      = "policy"       // the pool policy declined the request
	ReasonAdmission   = "admission"    // the admission backstop refused a new connection
	ReasonOwnerBusy   = "owner_busy"   // the owners of the upstream's connections had no room in time, and no other plan did; or wait_timeout ran out at one
	ReasonTableFull   = "table_full"   // the fleet's table had no room in time for another connection of a capped or HTTP/2 upstream, nor was one of its connections free
)

// Placeholders the transport sets on a refused request, for handle_errors
// routes: {http.vars.orbit_pool_retry_after} is the suggested Retry-After in
// whole seconds (unset when a retry would not help), and
// {http.vars.orbit_pool_refusal} the reason.
const (
	VarRetryAfter = "orbit_pool_retry_after"
	VarRefusal    = "orbit_pool_refusal"
)

// RefusalError is a request the fleet would not send upstream now. It is
// returned to reverse_proxy inside a caddyhttp.HandlerError carrying Status.
type RefusalError struct {
	// Status is the HTTP status to answer with: 503 or 504.
	Status int
	// RetryAfter is the suggested Retry-After, or 0 when a retry would not
	// help.
	RetryAfter time.Duration
	// Reason labels the refusal in logs and metrics.
	Reason string
	// Upstream is the upstream the request was for.
	Upstream string

	cause  error // the sentinel it matches
	detail error // what happened, for the message only
}

func (e *RefusalError) Error() string {
	return fmt.Sprintf("orbit_pool: request to %s refused (%s): %v", e.Upstream, e.Reason, e.detail)
}

// Unwrap returns the sentinel the refusal matches (backpressure's errors,
// proxy.ErrNoCapacity for a wait for a connection that timed out,
// proxy.ErrNotAdmitted, proxy.ErrOwnerBusy, orbitpool.ErrRefused or
// orbitpool.ErrFull),
// never the context error a timed-out wait ends with: reverse_proxy takes a
// context.Canceled for a client that went away.
func (e *RefusalError) Unwrap() error { return e.cause }

// classify turns a failed round trip into what reverse_proxy should see:
// the client's cancellation as is, refusals as caddyhttp errors with their
// status, retry-safe failures as dial errors, and a response header timeout
// or the request's deadline (dl, zero for none) passing as 504.
func (t *Transport) classify(req *http.Request, up *upstreamInfo, wg *waitGuard, dl time.Time, err error) error {
	if perr := req.Context().Err(); perr != nil {
		if errors.Is(perr, context.Canceled) {
			if !errors.Is(err, context.Canceled) {
				err = fmt.Errorf("%w: %w", perr, err)
			}
			return err
		}
		return t.refuseWith(req, up, backpressure.ErrDeadlineElapsed, err)
	}
	if errors.Is(err, proxy.ErrNotAdmitted) {
		r := backpressure.Refusal{Status: http.StatusServiceUnavailable, RetryAfter: time.Second, Reason: ReasonAdmission}
		return t.refuse(req, up, r, proxy.ErrNotAdmitted, err)
	}
	if wg.expired() {
		var we *orbitpool.WaitError
		if errors.Is(err, orbitpool.ErrFull) {
			// The wait was for room in the table, or for a connection of
			// a capped or HTTP/2 upstream (see proxy.Transport).
			r := backpressure.Refusal{Status: http.StatusServiceUnavailable, RetryAfter: time.Second, Reason: ReasonTableFull}
			return t.refuse(req, up, r, orbitpool.ErrFull, fmt.Errorf("no connection free within %s, and %w", t.wait, tableFullError(err)))
		}
		if errors.As(err, &we) {
			r := backpressure.Refusal{Status: http.StatusServiceUnavailable, RetryAfter: time.Second, Reason: waitReason(we.Reason)}
			return t.refuse(req, up, r, proxy.ErrNoCapacity, fmt.Errorf("no connection free within %s", t.wait))
		}
		if errors.Is(err, proxy.ErrOwnerBusy) {
			// The wait ran out at a sibling that had no room for the
			// request (the proxy returns that refusal, not a retry).
			r := backpressure.Refusal{Status: http.StatusServiceUnavailable, RetryAfter: time.Second, Reason: ReasonOwnerBusy}
			return t.refuse(req, up, r, proxy.ErrOwnerBusy, fmt.Errorf("no owner had room within %s: %w", t.wait, err))
		}
		r := backpressure.Refusal{Status: http.StatusServiceUnavailable, RetryAfter: time.Second, Reason: ReasonWaitTimeout}
		detail := fmt.Sprintf("no permit or worker free within %s", t.wait)
		if errors.Is(err, proxy.ErrLeaseRefused) { // a sibling leaving, or its connection gone
			detail = fmt.Sprintf("no connection within %s: the sibling it went to refused it", t.wait)
		}
		return t.refuse(req, up, r, errWaitTimeout, fmt.Errorf("%s: %w", detail, err))
	}
	for _, sentinel := range []error{
		backpressure.ErrQuotaExceeded,
		backpressure.ErrSaturated,
		backpressure.ErrDeadlineNear,
		backpressure.ErrDeadlineElapsed,
	} {
		if errors.Is(err, sentinel) {
			return t.refuseWith(req, up, sentinel, err)
		}
	}
	if !dl.IsZero() && !time.Now().Before(dl) && errors.Is(err, context.DeadlineExceeded) {
		return t.refuseWith(req, up, backpressure.ErrDeadlineElapsed, err)
	}
	if errors.Is(err, orbitpool.ErrRefused) {
		r := backpressure.Refusal{Status: http.StatusServiceUnavailable, RetryAfter: time.Second, Reason: ReasonPolicy}
		return t.refuse(req, up, r, orbitpool.ErrRefused, err)
	}
	if errors.Is(err, proxy.ErrOwnerBusy) {
		r := backpressure.Refusal{Status: http.StatusServiceUnavailable, RetryAfter: time.Second, Reason: ReasonOwnerBusy}
		return t.refuse(req, up, r, proxy.ErrOwnerBusy, err)
	}
	if errors.Is(err, orbitpool.ErrFull) {
		r := backpressure.Refusal{Status: http.StatusServiceUnavailable, RetryAfter: time.Second, Reason: ReasonTableFull}
		return t.refuse(req, up, r, orbitpool.ErrFull, tableFullError(err))
	}
	if proxy.IsRetrySafe(err) {
		return reverseproxy.NewDialError(err)
	}
	if errors.Is(err, proxy.ErrResponseHeaderTimeout) {
		return caddyhttp.Error(http.StatusGatewayTimeout, err)
	}
	return err
}

// tableFullError says what to change for a request refused for want of
// room in the table.
func tableFullError(err error) error {
	return fmt.Errorf("the fleet's table has no room for another connection (raise the orbit_pool app's conns_per_process or keys): %w", err)
}

// refuseWith refuses as backpressure.RefusalFor says for sentinel.
func (t *Transport) refuseWith(req *http.Request, up *upstreamInfo, sentinel, detail error) error {
	r, _ := backpressure.RefusalFor(sentinel)
	return t.refuse(req, up, r, sentinel, detail)
}

func waitReason(r orbitpool.Reason) string {
	switch r {
	case orbitpool.ReasonBudget:
		return ReasonBudget
	case orbitpool.ReasonCreating:
		return ReasonCreating
	case orbitpool.ReasonPolicy:
		return ReasonPolicy
	}
	return ReasonBusy
}

// refuse counts and logs a refusal, publishes its Retry-After for error
// routes, and returns it as a caddyhttp error.
func (t *Transport) refuse(req *http.Request, up *upstreamInfo, r backpressure.Refusal, cause, detail error) error {
	localMetrics.refused.WithLabelValues(up.label, r.Reason).Inc()
	ctx := req.Context()
	if ra := r.RetryAfterHeader(); ra != "" {
		caddyhttp.SetVar(ctx, VarRetryAfter, ra)
	}
	caddyhttp.SetVar(ctx, VarRefusal, r.Reason)
	t.logf(zapcore.DebugLevel, "request refused",
		zap.String("upstream", up.name),
		zap.String("reason", r.Reason),
		zap.Int("status", r.Status),
		zap.Duration("retry_after", r.RetryAfter),
		zap.Error(detail))
	return caddyhttp.Error(r.Status, &RefusalError{
		Status:     r.Status,
		RetryAfter: r.RetryAfter,
		Reason:     r.Reason,
		Upstream:   up.name,
		cause:      cause,
		detail:     detail,
	})
}
