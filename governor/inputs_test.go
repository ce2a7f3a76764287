package governor

import (
	"math"
	"runtime"
	"testing"
	"testing/fstest"
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
	if g := FromInputs(in, 0); g.Workers() < 1 || g.Workers() > runtime.NumCPU() {
		t.Errorf("FromInputs(DetectInputs()) has %d workers on a %d-CPU machine", g.Workers(), runtime.NumCPU())
	}
}

func file(s string) *fstest.MapFile { return &fstest.MapFile{Data: []byte(s)} }

func TestCgroupLimits(t *testing.T) {
	tests := []struct {
		name    string
		fs      fstest.MapFS
		wantCPU float64
		wantMem uint64
	}{
		{
			name:    "no cgroup files",
			fs:      fstest.MapFS{},
			wantCPU: 0, wantMem: 0,
		},
		{
			name: "v2 with a cgroup namespace",
			fs: fstest.MapFS{
				"proc/self/cgroup":         file("0::/\n"),
				"proc/self/mountinfo":      file("30 22 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"),
				"sys/fs/cgroup/cpu.max":    file("250000 100000\n"),
				"sys/fs/cgroup/memory.max": file("1073741824\n"),
			},
			wantCPU: 2.5, wantMem: 1 << 30,
		},
		{
			name: "v2 unlimited",
			fs: fstest.MapFS{
				"proc/self/cgroup":         file("0::/\n"),
				"proc/self/mountinfo":      file("30 22 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"),
				"sys/fs/cgroup/cpu.max":    file("max 100000\n"),
				"sys/fs/cgroup/memory.max": file("max\n"),
			},
		},
		{
			name: "v2 tightest ancestor wins",
			fs: fstest.MapFS{
				"proc/self/cgroup":    file("0::/system.slice/caddy.service\n"),
				"proc/self/mountinfo": file("30 22 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"),
				"sys/fs/cgroup/system.slice/caddy.service/cpu.max":    file("400000 100000\n"),
				"sys/fs/cgroup/system.slice/caddy.service/memory.max": file("max\n"),
				"sys/fs/cgroup/system.slice/cpu.max":                  file("200000 100000\n"),
				"sys/fs/cgroup/system.slice/memory.max":               file("536870912\n"),
			},
			wantCPU: 2, wantMem: 512 << 20,
		},
		{
			name: "v1 hybrid host: controllers on v1, empty unified hierarchy",
			fs: fstest.MapFS{
				"proc/self/cgroup": file("4:memory:/jobs/42\n2:cpu,cpuacct:/\n0::/\n"),
				"proc/self/mountinfo": file(
					"31 30 0:28 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n" +
						"34 30 0:31 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n" +
						"40 30 0:37 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n"),
				"sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us":         file("-1\n"),
				"sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us":        file("100000\n"),
				"sys/fs/cgroup/memory/jobs/42/memory.limit_in_bytes": file("268435456\n"),
				"sys/fs/cgroup/memory/jobs/memory.limit_in_bytes":    file("9223372036854771712\n"),
				"sys/fs/cgroup/memory/memory.limit_in_bytes":         file("9223372036854771712\n"),
			},
			wantCPU: 0, wantMem: 256 << 20,
		},
		{
			name: "v1 container without a namespace: mount root is the cgroup",
			fs: fstest.MapFS{
				"proc/self/cgroup": file("5:cpu,cpuacct:/docker/abc\n3:memory:/docker/abc\n"),
				"proc/self/mountinfo": file(
					"31 30 0:28 /docker/abc /sys/fs/cgroup/cpu,cpuacct ro - cgroup cgroup rw,cpu,cpuacct\n" +
						"34 30 0:31 /docker/abc /sys/fs/cgroup/memory ro - cgroup cgroup rw,memory\n"),
				"sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us":  file("50000\n"),
				"sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us": file("100000\n"),
				"sys/fs/cgroup/memory/memory.limit_in_bytes":  file("104857600\n"),
			},
			wantCPU: 0.5, wantMem: 100 << 20,
		},
		{
			name: "escaped mount point",
			fs: fstest.MapFS{
				"proc/self/cgroup":    file("0::/\n"),
				"proc/self/mountinfo": file(`30 22 0:26 / /cg\040root rw - cgroup2 cgroup2 rw` + "\n"),
				"cg root/cpu.max":     file("100000 100000\n"),
			},
			wantCPU: 1,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cpu, mem := cgroupLimits(tt.fs)
			if cpu != tt.wantCPU || mem != tt.wantMem {
				t.Errorf("cgroupLimits = %v CPUs, %d bytes; want %v, %d", cpu, mem, tt.wantCPU, tt.wantMem)
			}
		})
	}
}
