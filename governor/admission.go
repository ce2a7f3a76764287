package governor

import "sync/atomic"

// DefaultInFlightCeiling is the admission ceiling of a gate built without one.
//
// It is a backstop, not a scheduler. It exists so that a pathological fan-out
// (a misbehaving client opening thousands of streams, a retry storm, a loop
// between proxies) cannot exhaust file handles or goroutines. An in-flight
// exchange costs a goroutine or two and a handle or two, so 32768 stays far
// below the open-file limit a Go process runs with (the runtime raises the
// soft limit to the hard one, commonly half a million or more), and far
// above what the upstream caps let a process run at once and the long-lived
// exchanges (event streams, long polls) it holds open, a connection each,
// for as long as they last. In ordinary operation it
// decides nothing: the upstream budgets and the deadline-aware permits are
// what decide how much runs. If this number is ever what traffic waits on,
// the interesting bug is upstream of here.
const DefaultInFlightCeiling = 32768

// Admission is the gate on starting one more unit of work.
//
// It never blocks: a refusal is a decision the caller's next attempt re-asks,
// so there is no hold to bound and no way for the gate to wedge a caller that
// is otherwise ready. It admits on a count of cheap local resources alone;
// load average and CPU are deliberately absent, because a unit parked on a
// socket costs a goroutine and a handle, not CPU, and gating it on CPU would
// refuse work the real limiters downstream have room for. Nothing running is
// ever cancelled by it.
type Admission struct {
	ceiling atomic.Int64
}

// NewAdmission returns a gate that admits while fewer than ceiling units are
// in flight. A ceiling below 1 means DefaultInFlightCeiling: a gate that
// admits nothing would be a drain switch, which is not this tool's job.
func NewAdmission(ceiling int) *Admission {
	a := new(Admission)
	a.SetCeiling(ceiling)
	return a
}

// hostAdmission is process-wide because what it bounds is: every path that
// starts work in this process draws on one goroutine budget and one file
// table, and a per-caller gate would each count only its own share.
var hostAdmission = NewAdmission(DefaultInFlightCeiling)

// DefaultAdmission is the shared gate every path that starts work consults.
func DefaultAdmission() *Admission { return hostAdmission }

// Admit reports whether one more unit may start, given that the caller
// already has inFlight running. It never blocks.
func (a *Admission) Admit(inFlight int) bool {
	return int64(inFlight) < a.ceiling.Load()
}

// Ceiling is the number of units in flight at which Admit starts refusing.
func (a *Admission) Ceiling() int { return int(a.ceiling.Load()) }

// SetCeiling changes the ceiling for later Admit calls; units already running
// are unaffected. A ceiling below 1 restores DefaultInFlightCeiling.
func (a *Admission) SetCeiling(ceiling int) {
	if ceiling < 1 {
		ceiling = DefaultInFlightCeiling
	}
	a.ceiling.Store(int64(ceiling))
}
