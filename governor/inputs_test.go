package governor

import (
	"math"
	"runtime"
	"testing"
)

func TestFromInputs(t *testing.T) {
	const gib = 1 << 30
	tests := []struct {
		name        string
		in          Inputs
		memoryLimit uint64
		wantWorkers int
		wantMemory  uint64
	}{
		{name: "nothing known", wantWorkers: 1, wantMemory: DefaultMemoryLimit},
		{name: "bare machine", in: Inputs{NumCPU: 16, GOMAXPROCS: 16, GoMemoryLimit: math.MaxInt64},
			wantWorkers: 16, wantMemory: DefaultMemoryLimit},
		{name: "GOMAXPROCS lowered", in: Inputs{NumCPU: 16, GOMAXPROCS: 4}, wantWorkers: 4, wantMemory: DefaultMemoryLimit},
		{name: "GOMAXPROCS above the CPUs", in: Inputs{NumCPU: 4, GOMAXPROCS: 64}, wantWorkers: 4, wantMemory: DefaultMemoryLimit},
		{name: "fractional quota rounds up", in: Inputs{NumCPU: 16, GOMAXPROCS: 16, CPUQuota: 1.5}, wantWorkers: 2, wantMemory: DefaultMemoryLimit},
		{name: "tiny quota still one worker", in: Inputs{NumCPU: 16, GOMAXPROCS: 16, CPUQuota: 0.1}, wantWorkers: 1, wantMemory: DefaultMemoryLimit},
		{name: "container memory", in: Inputs{NumCPU: 8, GOMAXPROCS: 8, MemoryLimit: 2 * gib}, wantWorkers: 8, wantMemory: 2 * gib / MemoryFraction},
		{name: "GOMEMLIMIT tighter than the cgroup", in: Inputs{NumCPU: 8, MemoryLimit: 4 * gib, GoMemoryLimit: 1 * gib},
			wantWorkers: 8, wantMemory: gib / MemoryFraction},
		{name: "cgroup tighter than GOMEMLIMIT", in: Inputs{NumCPU: 8, MemoryLimit: 1 * gib, GoMemoryLimit: 4 * gib},
			wantWorkers: 8, wantMemory: gib / MemoryFraction},
		{name: "GOMEMLIMIT alone", in: Inputs{NumCPU: 2, GoMemoryLimit: 400 << 20}, wantWorkers: 2, wantMemory: 100 << 20},
		{name: "explicit limit wins", in: Inputs{NumCPU: 2, MemoryLimit: gib}, memoryLimit: 12345, wantWorkers: 2, wantMemory: 12345},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := FromInputs(tt.in, tt.memoryLimit)
			if g.Workers() != tt.wantWorkers || g.MemoryLimit() != tt.wantMemory {
				t.Errorf("FromInputs(%+v, %d) = %d workers, %d bytes; want %d, %d",
					tt.in, tt.memoryLimit, g.Workers(), g.MemoryLimit(), tt.wantWorkers, tt.wantMemory)
			}
		})
	}
}

func TestDetectInputsReadsTheRuntime(t *testing.T) {
	in := DetectInputs()
	if in.NumCPU != runtime.NumCPU() || in.GOMAXPROCS != runtime.GOMAXPROCS(0) {
		t.Errorf("DetectInputs() = %+v; want NumCPU %d, GOMAXPROCS %d", in, runtime.NumCPU(), runtime.GOMAXPROCS(0))
	}
	if in.GoMemoryLimit <= 0 {
		t.Errorf("GoMemoryLimit = %d; the runtime always reports a positive limit", in.GoMemoryLimit)
	}
	if in.CPUQuota != 0 || in.MemoryLimit != 0 {
		t.Errorf("DetectInputs() = %+v; the cgroup is the runtime's and the caller's to read", in)
	}
	if g := FromInputs(in, 0); g.Workers() < 1 || g.Workers() > runtime.NumCPU() {
		t.Errorf("FromInputs(DetectInputs()) has %d workers on a %d-CPU machine", g.Workers(), runtime.NumCPU())
	}
}
