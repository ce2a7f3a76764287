package orbitpool

import (
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Futex operations (linux/futex.h); x/sys/unix does not export them.
const (
	futexOpWait = 0
	futexOpWake = 1
)

// The futex calls use the shared (not private) forms: the doorbell word lives
// in a MAP_SHARED mapping that other processes wait on and ring.

// futexWait sleeps while *addr == val, at most d (d <= 0 means no limit).
func futexWait(addr *uint32, val uint32, d time.Duration) {
	var ts *unix.Timespec
	if d > 0 {
		t := unix.NsecToTimespec(d.Nanoseconds())
		ts = &t
	}
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexOpWait, uintptr(val), uintptr(unsafe.Pointer(ts)), 0, 0)
}

// futexWake wakes every sleeper on addr.
func futexWake(addr *uint32) {
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexOpWake, uintptr(1<<31-1), 0, 0, 0)
}
