package upstream

import (
	"time"

	"golang.org/x/sys/unix"
)

// holdParked is how much of a hold the runtime sleeps, parking only the
// goroutine, before the rest is slept by the thread itself.
const holdParked = 2 * time.Millisecond

// hold blocks for d, to within the kernel's timer slack. The upstream's
// delay is what a capped scenario's ceiling is computed from (connections
// over delay), so it has to be the time a request really holds its
// connection. time.Sleep alone overshoots on Linux by up to a millisecond:
// the runtime's poller waits in whole milliseconds and rounds a remainder
// below one up. With it a 5ms delay held each request 5.4 to 5.65ms on a
// 2-core machine, and a client that held the 16 connections itself reached
// only 86% of the 3,200 req/s the delay promises. So the runtime sleeps all
// but the last stretch, and the thread sleeps that against an absolute
// deadline; at most about a thread per 2ms of requests in flight is blocked.
func hold(d time.Duration) {
	var now unix.Timespec
	if unix.ClockGettime(unix.CLOCK_MONOTONIC, &now) != nil {
		time.Sleep(d)
		return
	}
	deadline := unix.NsecToTimespec(now.Nano() + int64(d))
	if d > holdParked {
		time.Sleep(d - holdParked)
	}
	for unix.ClockNanosleep(unix.CLOCK_MONOTONIC, unix.TIMER_ABSTIME, &deadline, nil) == unix.EINTR {
	}
}
