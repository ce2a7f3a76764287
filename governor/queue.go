package governor

import "container/list"

// waiter is a caller parked because no worker was free. granted is written
// under Governor.mu before ready is closed.
type waiter struct {
	want, per uint64
	granted   uint64
	ready     chan struct{}
	elem      *list.Element // in Governor.queue while queued
}
