package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestAdv73bRandomKillsUnderChurn: cap 4 of an HTTP/1.1 key. In each of 5
// rounds a child process sends GETs from 6 goroutines (dialing, leasing,
// relaying, idling) and is SIGKILLed at a random instant while this
// process sends GETs from 4 goroutines (which also use the child's
// connections). Properties: the upstream never holds more than 4
// connections; this process's requests fail only with the dead owner
// (ErrOwnerGone) within 1s of a kill; after the last kill its 4 concurrent
// requests get the whole cap (4 connections at once) within 5s.
func TestAdv73bRandomKillsUnderChurn(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test")
	}
	const C = 4
	var inSlow, peakSlow atomic.Int64 // handlers of the final 500ms requests
	srv, counts := countingUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ms, _ := strconv.Atoi(r.URL.Query().Get("ms"))
		if ms == 500 {
			adv73bMax(&peakSlow, inSlow.Add(1))
			defer inSlow.Add(-1)
		}
		time.Sleep(time.Duration(ms) * time.Millisecond)
		io.WriteString(w, "ok")
	}))
	seg := filepath.Join(t.TempDir(), "seg")
	me := adv73bMember(t, seg, 0, func(tr *Transport) { tr.MaxConnsPerKey = C })
	get := func(ms int) error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", fmt.Sprintf("%s/?ms=%d", srv.URL, ms), nil)
		resp, err := me.tr.RoundTrip(req)
		if err != nil {
			return err
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err == nil && string(b) != "ok" {
			err = fmt.Errorf("body %q", b)
		}
		return err
	}
	var lastKill atomic.Int64 // unix ns
	var mu sync.Mutex
	var bad []string
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var okCount atomic.Int64
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				err := get(rand.IntN(10))
				if err == nil {
					okCount.Add(1)
					continue
				}
				since := time.Duration(time.Now().UnixNano() - lastKill.Load())
				if !errors.Is(err, ErrOwnerGone) || since > time.Second {
					mu.Lock()
					bad = append(bad, fmt.Sprintf("%v after a kill (retry-safe %v): %v", since.Round(time.Millisecond), IsRetrySafe(err), err))
					mu.Unlock()
				}
			}
		})
	}
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 73))
	for round := range 5 {
		c := startAdv73bChild(t, seg, C, "ORBIT_HOLD=200ms")
		c.send(t, "loop 6 "+srv.URL+"/?ms=3")
		c.expect(t, "looping")
		time.Sleep(time.Duration(50+rng.IntN(300)) * time.Millisecond)
		lastKill.Store(time.Now().UnixNano())
		c.kill(t)
		if _, peak, _ := counts(); peak > C {
			t.Fatalf("round %d: the upstream held %d connections at once, cap %d", round, peak, C)
		}
	}
	time.Sleep(300 * time.Millisecond)
	close(stop)
	wg.Wait()
	mu.Lock()
	for _, b := range bad {
		t.Errorf("a survivor's request failed %s", b)
	}
	mu.Unlock()
	if okCount.Load() == 0 {
		t.Fatal("no request of this process succeeded")
	}
	// The whole cap back: 4 requests of 500ms at once must be served by 4
	// connections concurrently.
	start := time.Now()
	var wg2 sync.WaitGroup
	for range C {
		wg2.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL+"/?ms=500", nil)
			resp, err := me.tr.RoundTrip(req)
			if err != nil {
				t.Errorf("after the last kill: %v", err)
				return
			}
			drain(resp)
		})
	}
	wg2.Wait()
	if p := peakSlow.Load(); p != C {
		t.Errorf("%d requests of 500ms sent at once ran %d at a time at the upstream (in %v): the cap %d is not all back", C, p, time.Since(start).Round(time.Millisecond), C)
	}
	if _, peak, _ := counts(); peak > C {
		t.Errorf("the upstream held %d connections at once, cap %d", peak, C)
	}
	t.Logf("ok %d", okCount.Load())
}
