package proxy

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"
)

// patternReader produces n bytes without holding them.
type patternReader struct{ n int64 }

func (p *patternReader) Read(b []byte) (int, error) {
	if p.n <= 0 {
		return 0, io.EOF
	}
	k := min(int64(len(b)), p.n)
	for i := range b[:k] {
		b[i] = byte('a' + i%26)
	}
	p.n -= k
	return int(k), nil
}

// heapWatch samples the heap while a transfer runs.
type heapWatch struct {
	base, peak atomic.Uint64
	stop       chan struct{}
	done       chan struct{}
}

func watchHeap() *heapWatch {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	h := &heapWatch{stop: make(chan struct{}), done: make(chan struct{})}
	h.base.Store(ms.HeapInuse)
	go func() {
		defer close(h.done)
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-h.stop:
				return
			case <-t.C:
				var ms runtime.MemStats
				runtime.ReadMemStats(&ms)
				if ms.HeapInuse > h.peak.Load() {
					h.peak.Store(ms.HeapInuse)
				}
			}
		}
	}()
	return h
}

func (h *heapWatch) growth() int64 {
	close(h.stop)
	<-h.done
	return int64(h.peak.Load()) - int64(h.base.Load())
}

// TestGiantBodyBoundedMemory moves 1 GiB each way (64 MiB under the race
// detector or -short) and requires the heap to stay within a few MiB: no leg
// buffers a body.
func TestGiantBodyBoundedMemory(t *testing.T) {
	size := int64(1 << 30)
	if raceEnabled || testing.Short() {
		size = 64 << 20
	}
	const limit = 32 << 20
	u := newTestUpstream(t)
	paths(t, nil, func(t *testing.T, rt http.RoundTripper, owner *member, _ func() http.RoundTripper) {
		warm(t, owner, u.url("/cl"))
		h := watchHeap()
		resp, err := get(t, context.Background(), rt, u.url(fmt.Sprintf("/big?n=%d", size)))
		if err != nil {
			t.Fatal(err)
		}
		n, err := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err != nil || n != size {
			t.Fatalf("download: %d bytes, %v", n, err)
		}
		if g := h.growth(); g > limit {
			t.Errorf("heap grew %d MiB during a %d MiB download", g>>20, size>>20)
		}

		warm(t, owner, u.url("/cl"))
		h = watchHeap()
		req, _ := http.NewRequest("POST", u.url("/sink"), &patternReader{n: size})
		req.ContentLength = -1
		resp, err = rt.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if got, _ := strconv.ParseInt(string(b), 10, 64); got != size {
			t.Fatalf("upload: upstream saw %s bytes", b)
		}
		if g := h.growth(); g > limit {
			t.Errorf("heap grew %d MiB during a %d MiB upload", g>>20, size>>20)
		}
	})
}
