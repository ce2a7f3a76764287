package orbitpool

// Multi-process benchmarks. Each benchmark run starts fresh child processes
// (see multiproc_test.go) with b.N as their count; the children time
// themselves with CLOCK_MONOTONIC, which is comparable across processes.
//
//	go test -run '^$' -bench MultiProc -benchtime 2s ./orbitpool/

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"runtime"
	"slices"
	"sync/atomic"
	"testing"
	"time"
)

// mpBenchSpec is small, so that Snapshot and Reconcile scans are cheap.
var mpBenchSpec = PoolSpec{Lanes: 4, Keys: 8, ResourcesPerLane: 8}

var mpKeyBench = Key{Hi: 0x6d70, Lo: 0xbe}

// mpRoleBenchOwner owns the contended resource. It runs N local
// Reserve->Accept->Complete cycles on it, and accepts and completes the
// leases its sibling streams over a unix socket; an all-zero frame asks for
// an acknowledgement once everything before it is done.
func mpRoleBenchOwner(c *mpChildCtx) error {
	p, err := c.open()
	if err != nil {
		return err
	}
	defer p.Close()
	id, err := p.Register(mpKeyBench, c.args.Cap)
	if err != nil {
		return err
	}
	ln, err := net.Listen("unix", mpSockPath(c.args.Dir, p.Lane()))
	if err != nil {
		return err
	}
	defer ln.Close()
	var bad atomic.Int64
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		defer conn.Close()
		r := bufio.NewReaderSize(conn, 64*LeaseSize)
		var frame, zero [LeaseSize]byte
		for {
			if _, err := io.ReadFull(r, frame[:]); err != nil {
				return
			}
			if frame == zero {
				conn.Write([]byte{mpOK})
				continue
			}
			var l Lease
			if err := l.UnmarshalBinary(frame[:]); err != nil {
				bad.Add(1)
				continue
			}
			e, err := p.Accept(l)
			if err != nil {
				bad.Add(1)
				continue
			}
			e.Complete()
		}
	}()
	c.send(mpMsg{Type: "ready", Lane: p.Lane(), IDs: []ResourceID{id}})
	if _, err := c.expect("go"); err != nil {
		return err
	}
	busy := 0
	start := mpMono()
	for i := 0; i < c.args.N; {
		l, err := p.Reserve(id)
		if errors.Is(err, ErrBusy) {
			busy++
			runtime.Gosched()
			continue
		}
		if err != nil {
			return err
		}
		e, err := p.Accept(l)
		if err != nil {
			return err
		}
		e.Complete()
		i++
	}
	end := mpMono()
	c.send(mpMsg{Type: "done", T: start, T2: end, N: busy})
	c.untilParentLeaves()
	if n := bad.Load(); n > 0 {
		return fmt.Errorf("%d of the sibling's leases were refused", n)
	}
	return nil
}

// mpRoleBenchRemote reserves the sibling's resource N times and streams the
// leases to it, flushing whenever the resource is full.
func mpRoleBenchRemote(c *mpChildCtx) error {
	p, err := c.open()
	if err != nil {
		return err
	}
	defer p.Close()
	id := c.args.IDs[0]
	conn, err := net.Dial("unix", mpSockPath(c.args.Dir, id.Lane()))
	if err != nil {
		return err
	}
	defer conn.Close()
	w := bufio.NewWriterSize(conn, 64*LeaseSize)
	c.send(mpMsg{Type: "ready", Lane: p.Lane()})
	if _, err := c.expect("go"); err != nil {
		return err
	}
	var scratch [LeaseSize]byte
	busy := 0
	start := mpMono()
	for i := 0; i < c.args.N; {
		l, err := p.Reserve(id)
		if errors.Is(err, ErrBusy) {
			busy++
			if err := w.Flush(); err != nil {
				return err
			}
			runtime.Gosched()
			continue
		}
		if err != nil {
			return err
		}
		b, _ := l.AppendBinary(scratch[:0])
		if _, err := w.Write(b); err != nil {
			return err
		}
		i++
	}
	clear(scratch[:])
	w.Write(scratch[:])
	if err := w.Flush(); err != nil {
		return err
	}
	var ack [1]byte
	if _, err := io.ReadFull(conn, ack[:]); err != nil {
		return err
	}
	end := mpMono()
	c.send(mpMsg{Type: "done", T: start, T2: end, N: busy})
	c.untilParentLeaves()
	return nil
}

// BenchmarkMultiProcReserveAcceptComplete is Reserve->Accept->Complete on one
// resource (capacity 4) from two processes at once: b.N/2 cycles in its owner,
// b.N/2 in a sibling whose leases go to the owner over a unix socket for
// Accept and Complete. ns/op is wall time over all b.N cycles; busy/op counts
// reservations refused because the resource was full; owner-ns/cycle and
// remote-ns/cycle are each side's own elapsed time over its own cycles (the
// remote side includes the socket hand-off, which bounds it).
func BenchmarkMultiProcReserveAcceptComplete(b *testing.B) {
	spec := mpBenchSpec
	spec.Path = filepath.Join(b.TempDir(), "seg")
	args := mpArgs{Spec: spec, Reconcile: 250 * time.Millisecond, ResTimeout: 10 * time.Second, Dir: mpSockDir(b), Cap: 4, N: b.N / 2}
	owner := mpStart(b, "bench-owner", args)
	om := owner.expect("ready", 30*time.Second)
	args.IDs, args.N = om.IDs, b.N-b.N/2
	remote := mpStart(b, "bench-remote", args)
	remote.expect("ready", 30*time.Second)
	b.ResetTimer()
	owner.send(mpMsg{Type: "go"})
	remote.send(mpMsg{Type: "go"})
	od := owner.expect("done", 10*time.Minute)
	rd := remote.expect("done", 10*time.Minute)
	b.StopTimer()
	wall := max(od.T2, rd.T2) - min(od.T, rd.T)
	b.ReportMetric(float64(wall)/float64(b.N), "ns/op")
	b.ReportMetric(float64(od.N+rd.N)/float64(b.N), "busy/op")
	if n := b.N / 2; n > 0 {
		b.ReportMetric(float64(od.T2-od.T)/float64(n), "owner-ns/cycle")
	}
	b.ReportMetric(float64(rd.T2-rd.T)/float64(b.N-b.N/2), "remote-ns/cycle")
	owner.finish(10 * time.Second)
	remote.finish(10 * time.Second)
}

// mpRoleBenchPing owns a capacity-1 resource and holds it. N times: wait
// until the sibling has parked in Acquire on it, Complete, and read back the
// sibling's lease and the CLOCK_MONOTONIC reading it took when its Acquire
// returned; accept the lease, which holds the resource again.
func mpRoleBenchPing(c *mpChildCtx) error {
	p, err := c.open()
	if err != nil {
		return err
	}
	defer p.Close()
	if _, err := p.Register(mpKeyBench, 1); err != nil {
		return err
	}
	plan, err := p.Acquire(context.Background(), mpKeyBench, LocalOnly{}, Limits{})
	if err != nil {
		return err
	}
	e := plan.Execution
	ln, err := net.Listen("unix", mpSockPath(c.args.Dir, p.Lane()))
	if err != nil {
		return err
	}
	defer ln.Close()
	c.send(mpMsg{Type: "ready", Lane: p.Lane()})
	conn, err := ln.Accept()
	if err != nil {
		return err
	}
	defer conn.Close()
	if _, err := c.expect("go"); err != nil {
		return err
	}
	lats := make([]int64, 0, c.args.N)
	var frame [LeaseSize + 8]byte
	for range c.args.N {
		deadline := time.Now().Add(10 * time.Second)
		for mpWaiting(p, mpKeyBench) == 0 {
			if time.Now().After(deadline) {
				return errors.New("the sibling never parked")
			}
			runtime.Gosched()
		}
		// Let the sibling's goroutine block and its dispatcher reach the
		// futex: the wake from sleep is what is measured.
		time.Sleep(100 * time.Microsecond)
		t0 := mpMono()
		e.Complete()
		if _, err := io.ReadFull(conn, frame[:]); err != nil {
			return err
		}
		lats = append(lats, int64(binary.LittleEndian.Uint64(frame[LeaseSize:]))-t0)
		var l Lease
		if err := l.UnmarshalBinary(frame[:LeaseSize]); err != nil {
			return err
		}
		if e, err = p.Accept(l); err != nil {
			return err
		}
	}
	e.Complete()
	slices.Sort(lats)
	q := func(f float64) int64 { return lats[min(len(lats)-1, int(f*float64(len(lats))))] }
	var sum int64
	for _, v := range lats {
		sum += v
	}
	c.send(mpMsg{Type: "done", Nanos: []int64{q(0.5), q(0.9), q(0.99), lats[len(lats)-1], sum / int64(len(lats))}})
	c.untilParentLeaves()
	return nil
}

// mpWaiting is how many goroutines of the whole fleet are parked on k, read
// straight from the table (cheaper than a Snapshot in a spin).
func mpWaiting(p *Pool, k Key) int {
	ref, ok := p.lookupKey(k)
	if !ok {
		return 0
	}
	s, n := p.seg, 0
	for l := range p.l.nlanes {
		n += int(atomic.LoadUint32(s.u32(s.waitOff(l, ref.idx))))
	}
	return n
}

func mpRoleBenchPong(c *mpChildCtx) error {
	p, err := c.open()
	if err != nil {
		return err
	}
	defer p.Close()
	conn, err := net.Dial("unix", mpSockPath(c.args.Dir, c.args.Peer))
	if err != nil {
		return err
	}
	defer conn.Close()
	c.send(mpMsg{Type: "ready", Lane: p.Lane()})
	if _, err := c.expect("go"); err != nil {
		return err
	}
	var frame [LeaseSize + 8]byte
	for range c.args.N {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		plan, err := p.Acquire(ctx, mpKeyBench, LocalFirst{}, Limits{MaxResources: 1})
		now := mpMono()
		cancel()
		if err != nil {
			return err
		}
		if plan.Kind != PlanReuseRemote {
			return fmt.Errorf("plan %v", plan.Kind)
		}
		plan.Lease.AppendBinary(frame[:0])
		binary.LittleEndian.PutUint64(frame[LeaseSize:], uint64(now))
		if _, err := conn.Write(frame[:]); err != nil {
			return err
		}
	}
	c.send(mpMsg{Type: "done"})
	c.untilParentLeaves()
	return nil
}

// BenchmarkMultiProcWakeLatency ping-pongs a capacity-1 resource between two
// processes: one parks in Acquire, the other Completes; p50-ns, p90-ns,
// p99-ns and max-ns are from Complete in one process until Acquire returned in
// the other (CLOCK_MONOTONIC on both sides). ns/op is one whole round,
// including a 100µs pause that lets the waiter fall asleep.
func BenchmarkMultiProcWakeLatency(b *testing.B) {
	spec := mpBenchSpec
	spec.Path = filepath.Join(b.TempDir(), "seg")
	args := mpArgs{Spec: spec, Reconcile: 250 * time.Millisecond, ResTimeout: 10 * time.Second, Dir: mpSockDir(b), N: b.N}
	ping := mpStart(b, "bench-ping", args)
	args.Peer = ping.expect("ready", 30*time.Second).Lane
	pong := mpStart(b, "bench-pong", args)
	pong.expect("ready", 30*time.Second)
	b.ResetTimer()
	ping.send(mpMsg{Type: "go"})
	pong.send(mpMsg{Type: "go"})
	m := ping.expect("done", 10*time.Minute)
	pong.expect("done", 10*time.Minute)
	b.StopTimer()
	for i, unit := range []string{"p50-ns", "p90-ns", "p99-ns", "max-ns", "mean-ns"} {
		b.ReportMetric(float64(m.Nanos[i]), unit)
	}
	ping.finish(10 * time.Second)
	pong.finish(10 * time.Second)
}

// BenchmarkMultiProcIdleWaitersCPU parks 1,000 goroutines in Acquire on 16
// keys in a child with nothing happening, and reports the child's CPU time
// (getrusage) over 2s of wall time: cpu-% of one core, and cpu-ns/s. It runs
// once whatever b.N.
func BenchmarkMultiProcIdleWaitersCPU(b *testing.B) {
	cpu, wall := mpIdleCPU(b, 1000, 2*time.Second)
	b.ReportMetric(100*float64(cpu)/float64(wall), "cpu-%")
	b.ReportMetric(float64(cpu)/wall.Seconds(), "cpu-ns/s")
	b.ReportMetric(0, "ns/op")
}
