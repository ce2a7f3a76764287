package backpressure

import (
	"context"
	"errors"
)

// Sentinel refusals; match them with errors.Is.
var (
	// ErrSaturated is a non-blocking acquire finding no permit free.
	ErrSaturated = errors.New("backpressure: no permit free")

	// ErrDeadlineNear is an acquire refused because too little time is left
	// before the deadline for new work to be useful. In-flight permits are
	// unaffected, so the work already started can finish.
	ErrDeadlineNear = errors.New("backpressure: deadline too near to start")

	// ErrQuotaExceeded is an acquire on a drained pool (a cap of 0). It is
	// answered at once: a cap of 0 grants nothing, ever, so waiting would
	// hang.
	ErrQuotaExceeded = errors.New("backpressure: pool drained (cap 0)")

	// ErrDeadlineElapsed is an acquire made at or after its deadline. It also
	// matches context.DeadlineExceeded, so code that only knows contexts
	// treats it as the timeout it is.
	ErrDeadlineElapsed error = deadlineError{}
)

type deadlineError struct{}

func (deadlineError) Error() string        { return "backpressure: deadline elapsed" }
func (deadlineError) Is(target error) bool { return target == context.DeadlineExceeded }
func (deadlineError) Timeout() bool        { return true }

// ctxError translates a done context's error: its deadline is a deadline like
// any other; a cancellation is the caller giving up, and stays one.
func ctxError(err error) error {
	if errors.Is(err, context.DeadlineExceeded) {
		return ErrDeadlineElapsed
	}
	return err
}
