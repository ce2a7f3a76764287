package proxy

import (
	"bufio"
	"errors"
	"net/textproto"
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
// full (so that a slow read loop, under -race, keeps up); once it is, the live heap must have grown by well under
// twice the limit. When the flush wrote by chunks and counted only what it
// had not written of its batch, the read loop refilled the queue by as
// much while the batch's whole array stayed alive: about twice the limit
// (LOW).
func TestAdv58QueueMemoryWithinLimit(t *testing.T) {
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

	deadline := time.Now().Add(5 * time.Second)
	for {
		if time.Now().After(deadline) {
			t.Fatalf("the queue never filled while the sibling read (read %d bytes)", read.Load())
		}
		r.mu.Lock()
		p, f := len(r.pending), r.inFlight
		r.mu.Unlock()
		if read.Load() > 3*limit && p+f >= limit*3/4 {
			pause.Store(true)
			break
		}
		time.Sleep(100 * time.Microsecond)
	}
	time.Sleep(50 * time.Millisecond)
	runtime.GC()
	runtime.ReadMemStats(&ms)
	grown := int64(ms.HeapAlloc) - int64(base)
	r.mu.Lock()
	p, f := len(r.pending), r.inFlight
	r.mu.Unlock()
	if grown > limit*3/2 {
		t.Errorf("with a header limit of %d MiB, the relay's live heap grew by %.1f MiB (pending %d KiB, inFlight %d KiB): the queue holds more than the limit it is bounded by",
			limit>>20, float64(grown)/(1<<20), p>>10, f>>10)
	}
}
