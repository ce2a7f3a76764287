package backpressure

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"time"
)

// StatusClientClosedRequest is the status logged for a request whose client
// went away. It is nginx's non-standard 499, which Caddy uses too; the
// client never sees it.
const StatusClientClosedRequest = 499

// Reasons label refusals in logs and metrics. They are stable: dashboards
// and alerts key on them.
const (
	ReasonSaturated       = "saturated"
	ReasonDraining        = "draining"
	ReasonDeadlineNear    = "deadline_near"
	ReasonDeadlineElapsed = "deadline_elapsed"
	ReasonClientCanceled  = "client_canceled"
)

// Refusal is what an HTTP proxy should answer when an acquire fails.
type Refusal struct {
	// Status is the HTTP status code to answer with.
	Status int

	// RetryAfter, when positive, is the delay to advertise in a Retry-After
	// header; zero means send none.
	RetryAfter time.Duration

	// Reason labels the refusal in logs and metrics.
	Reason string
}

// RefusalFor maps an error from Acquire or TryAcquire to the answer an HTTP
// proxy should give, and reports false for errors that are not refusals.
//
// Saturation and a drain are 503 with Retry-After: the condition is
// temporary, and on a fleet sharing a port a retry usually lands on a process
// with room. A near deadline is 503 without one: the request spent its budget
// waiting, and inviting every such client to retry would feed the overload
// that caused it. An elapsed deadline is 504, the gateway timing out. A
// client that cancelled is not an overload at all and gets its own reason, so
// it never counts against the proxy in metrics.
func RefusalFor(err error) (Refusal, bool) {
	switch {
	case err == nil:
		return Refusal{}, false
	case errors.Is(err, ErrSaturated):
		return Refusal{http.StatusServiceUnavailable, time.Second, ReasonSaturated}, true
	case errors.Is(err, ErrQuotaExceeded):
		return Refusal{http.StatusServiceUnavailable, time.Second, ReasonDraining}, true
	case errors.Is(err, ErrDeadlineNear):
		return Refusal{http.StatusServiceUnavailable, 0, ReasonDeadlineNear}, true
	case errors.Is(err, context.DeadlineExceeded): // ErrDeadlineElapsed matches it too
		return Refusal{http.StatusGatewayTimeout, 0, ReasonDeadlineElapsed}, true
	case errors.Is(err, context.Canceled):
		return Refusal{StatusClientClosedRequest, 0, ReasonClientCanceled}, true
	}
	return Refusal{}, false
}

// RetryAfterHeader is the Retry-After header value in whole seconds, rounded
// up, or "" when none should be sent.
func (r Refusal) RetryAfterHeader() string {
	if r.RetryAfter <= 0 {
		return ""
	}
	return strconv.FormatInt(int64((r.RetryAfter+time.Second-1)/time.Second), 10)
}
