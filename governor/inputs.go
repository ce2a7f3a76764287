package governor

import (
	"math"
	"runtime"
	"runtime/debug"
)

// Defaults FromInputs falls back on; pass explicit values to New to use
// others.
const (
	// DefaultMemoryLimit is the relay budget when nothing is known about the
	// machine's memory. It is enough for a few thousand 64 KiB relay buffers,
	// which is more than a proxy process forwards at once in ordinary
	// operation, and small enough not to matter on any machine that runs one.
	DefaultMemoryLimit = 256 << 20

	// MemoryFraction is the share of the known memory limit given to the
	// budget (1/MemoryFraction). The rest is for what the budget does not
	// track: the process's own heap, TLS state and connection tables, and the
	// garbage collector's headroom, which with the default GOGC lets the heap
	// grow to twice its live size before collecting.
	MemoryFraction = 4
)

// Inputs is what a process can learn about the machine it runs on, and all
// FromInputs looks at. Zero fields mean unknown, so a test or a caller with
// better knowledge can fill in only what it knows.
type Inputs struct {
	// NumCPU is the number of logical CPUs the process may run on
	// (runtime.NumCPU, which honours the affinity mask).
	NumCPU int

	// GOMAXPROCS is runtime.GOMAXPROCS(0): what the operator or the runtime
	// chose. Since Go 1.25 the runtime's default follows the cgroup CPU
	// bandwidth limit (rounded up, and at least 2), so it already carries
	// the CPU quota.
	GOMAXPROCS int

	// CPUQuota is the cgroup CPU bandwidth limit in CPUs (quota / period),
	// for a caller that knows it and wants it to count even where
	// GOMAXPROCS was set by hand; 0 when unknown. DetectInputs leaves it
	// unknown: GOMAXPROCS covers it.
	CPUQuota float64

	// MemoryLimit is the cgroup memory limit in bytes; 0 when unknown.
	// DetectInputs leaves it unknown (this package reads nothing but the
	// runtime); a caller fills it in from a cgroup reader such as
	// github.com/KimMachineGun/automemlimit/memlimit.FromCgroup, as the
	// Caddy module does. In a Caddy binary GoMemoryLimit carries it too:
	// Caddy's main sets GOMEMLIMIT from the cgroup with that package.
	MemoryLimit uint64

	// GoMemoryLimit is the runtime's soft memory limit (GOMEMLIMIT), as
	// debug.SetMemoryLimit(-1) reports it; 0 or math.MaxInt64 when unset.
	GoMemoryLimit int64
}

// DetectInputs reads the Go runtime's view of the process's limits: its CPU
// count and affinity, GOMAXPROCS (which since Go 1.25 follows the cgroup CPU
// limit) and GOMEMLIMIT. It parses no cgroup files itself: the runtime
// already applies the CPU limit, and a caller that wants the cgroup memory
// limit fills in MemoryLimit (see Inputs). It never fails.
func DetectInputs() Inputs {
	return Inputs{
		NumCPU:        runtime.NumCPU(),
		GOMAXPROCS:    runtime.GOMAXPROCS(0),
		GoMemoryLimit: debug.SetMemoryLimit(-1),
	}
}

// FromInputs builds a Governor sized to the machine described by inputs.
//
// Workers is the smallest of NumCPU, GOMAXPROCS and the CPU quota rounded up,
// counting only those that are known, and at least one: forwarding work is
// CPU work (copying and framing), and more runnable workers than the process
// may run at once would only queue in the scheduler. A quota of 1.5 CPUs
// gives two workers, so a fractional quota is used rather than wasted.
//
// memoryLimit, when not zero, is used as given. When it is zero the budget is
// 1/MemoryFraction of the smaller of the cgroup memory limit and GOMEMLIMIT,
// because both are limits the process must live within and the relay buffers
// are only part of its memory; when neither is known it is
// DefaultMemoryLimit.
func FromInputs(inputs Inputs, memoryLimit uint64) *Governor {
	return New(workersFrom(inputs), memoryFrom(inputs, memoryLimit))
}

func workersFrom(in Inputs) int {
	w := math.MaxInt
	if in.NumCPU > 0 {
		w = min(w, in.NumCPU)
	}
	if in.GOMAXPROCS > 0 {
		w = min(w, in.GOMAXPROCS)
	}
	if in.CPUQuota > 0 {
		w = min(w, int(math.Ceil(min(in.CPUQuota, MaxWorkers))))
	}
	if w == math.MaxInt {
		return 1
	}
	return max(w, 1)
}

func memoryFrom(in Inputs, explicit uint64) uint64 {
	if explicit != 0 {
		return explicit
	}
	var limit uint64 = math.MaxUint64
	if in.MemoryLimit > 0 {
		limit = in.MemoryLimit
	}
	if in.GoMemoryLimit > 0 && in.GoMemoryLimit != math.MaxInt64 {
		limit = min(limit, uint64(in.GoMemoryLimit))
	}
	if limit == math.MaxUint64 {
		return DefaultMemoryLimit
	}
	return max(limit/MemoryFraction, 1)
}
