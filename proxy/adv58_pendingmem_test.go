package proxy

import (
	"bufio"
	"errors"
	"net/textproto"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
)

// TestAdv58QueueMemoryWithinLimit: the queue of 1xx heads and what the
// flush has taken of it hold at most the header limit, in live memory too.
// Here a sibling reads at a moderate pace while the queue is at least half
// full (so that a slow read loop, under -race, keeps up), then stops; once
// the queue is full again, the live heap must have grown by well under
// twice the limit. When the flush wrote by chunks and counted only what it
// had not written of its batch, the read loop refilled the queue by as
// much while the batch's whole array stayed alive: about twice the limit
// (LOW). The heap is measured in a process of its own, where nothing but
// this test allocates, once the queue is full and its read loop waits.
func TestAdv58QueueMemoryWithinLimit(t *testing.T) {
	if !inOwnProcess(t) {
		return
	}
	const limit = 16 << 20
	a, peer := unixPair(t)
	r := &relay{bw: bufio.NewWriter(a), log: zap.NewNop(), shared: a, pendingLimit: limit}
	h := textproto.MIMEHeader{"Link": {"<" + strings.Repeat("a", 60<<10) + ">; rel=preload"}}

	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	base := ms.HeapAlloc

	var stop, pause atomic.Bool
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { // the HTTP/2 read loop
		defer wg.Done()
		for !stop.Load() {
			if err := r.relay1xx(103, h); err != nil && !errors.Is(err, errPeerNotReading) {
				return
			}
		}
	}()
	var read atomic.Int64
	go func() { // the sibling: reads 256 KiB every 2 ms while the queue is half full, until paused
		defer wg.Done()
		buf := make([]byte, 256<<10)
		for !stop.Load() {
			r.mu.Lock()
			half := len(r.pending)+r.inFlight >= limit/2
			r.mu.Unlock()
			if pause.Load() || !half {
				time.Sleep(time.Millisecond)
				continue
			}
			peer.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
			n, _ := peer.Read(buf)
			read.Add(int64(n))
			time.Sleep(2 * time.Millisecond)
		}
	}()
	defer func() {
		stop.Store(true)
		a.Close()
		peer.Close()
		wg.Wait()
	}()

	// The sibling reads as much as the limit; then it stops, and the read
	// loop fills the queue behind the flush's write, which waits for it.
	// Sampling the queue while the sibling still read found it over three
	// quarters full too rarely on a loaded machine, where the read loop
	// lags the reads.
	deadline := time.Now().Add(20 * time.Second)
	for read.Load() <= limit {
		if time.Now().After(deadline) {
			t.Fatalf("the sibling read %d bytes of the queue in 20s, want %d", read.Load(), limit)
		}
		time.Sleep(100 * time.Microsecond)
	}
	pause.Store(true)
	// Full: the next head (60 KiB) has no room, and the read loop waits
	// for room, allocating nothing. Measured while it still appended, the
	// heap held the array a growing queue had just left, until the next
	// collection: 28 MiB once, the queue itself holding 16.
	// The heap counts only if the queue stayed full, its read loop
	// waiting, from before the collections to after the reading: a queue
	// that had room again (seen once in CI: 10 MiB of it at the reading)
	// had its read loop appending, and the arrays an append leaves hold
	// the heap up until the next collection.
	queued := func() int {
		r.mu.Lock()
		defer r.mu.Unlock()
		return len(r.pending) + r.inFlight
	}
	full := func() bool { return queued() > limit-128<<10 }
	var grown int64
	for attempt := 1; ; attempt++ {
		waitFor(t, 5*time.Second, "the queue to fill behind the paused sibling", full)
		time.Sleep(50 * time.Millisecond)
		before := queued()
		runtime.GC()
		runtime.GC()
		runtime.ReadMemStats(&ms)
		grown = int64(ms.HeapAlloc) - int64(base)
		if after := queued(); after == before && full() {
			break
		} else if attempt == 5 {
			t.Fatalf("the queue did not stay full while the heap was measured, 5 times: %d bytes then %d", before, after)
		}
	}
	r.mu.Lock()
	p, f := len(r.pending), r.inFlight
	r.mu.Unlock()
	if grown > limit*3/2 {
		t.Errorf("with a header limit of %d MiB, the relay's live heap grew by %.1f MiB (pending %d KiB, inFlight %d KiB): the queue holds more than the limit it is bounded by",
			limit>>20, float64(grown)/(1<<20), p>>10, f>>10)
	}
}

// isolatedEnv names the one test a re-executed test binary runs by itself.
const isolatedEnv = "ORBIT_ISOLATED_TEST"

// inOwnProcess reports whether t runs in a test binary of its own. If not,
// it runs t in one, re-executing this binary, and fails t if that run
// fails: the caller then returns.
func inOwnProcess(t *testing.T) bool {
	t.Helper()
	if os.Getenv(isolatedEnv) == t.Name() {
		return true
	}
	cmd := exec.Command(os.Args[0], "-test.run=^"+t.Name()+"$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), isolatedEnv+"="+t.Name())
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s in a process of its own: %v\n%s", t.Name(), err, out)
	}
	if !strings.Contains(string(out), "--- PASS: "+t.Name()) {
		t.Fatalf("%s in a process of its own did not run:\n%s", t.Name(), out)
	}
	return false
}
