package proxy

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/internal/grpcmsg"
)

// TestAdv5H2ChurnNoLeak: from an owner and a sibling at once, a mix of
// exchanges on one h2c connection with a stream limit of 4: unary calls,
// trailers-only answers, endless streams closed after a message, streams
// cancelled mid-body, and requests that hit their deadline. Every
// completed call reads what the upstream sent; afterwards every stream's
// unit is back, the upstream has no handler left running, and the
// goroutines are back where they were.
func TestAdv5H2ChurnNoLeak(t *testing.T) {
	up := newEndlessUpstream(t, 4)
	owner, client := h2Pair(t, up.url)
	round := func(m *member, i int) error {
		switch i % 4 {
		case 0:
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			return getOK(m, ctx, up.url+"/")
		case 1:
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			resp, err := m.tr.RoundTrip(grpcReq(t, ctx, up.url+"/endless", http.NoBody))
			if err != nil {
				return err
			}
			p, err := grpcmsg.Read(resp.Body)
			resp.Body.Close()
			if err != nil || string(p) != "tick" {
				return fmt.Errorf("endless: %q %v", p, err)
			}
		case 2:
			ctx, cancel := context.WithCancel(context.Background())
			resp, err := m.tr.RoundTrip(grpcReq(t, ctx, up.url+"/endless", http.NoBody))
			if err != nil {
				cancel()
				return err
			}
			grpcmsg.Read(resp.Body)
			cancel()
			_, err = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if err == nil {
				return fmt.Errorf("cancelled stream ended cleanly")
			}
		case 3:
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
			defer cancel()
			resp, err := m.tr.RoundTrip(grpcReq(t, ctx, up.url+"/never", bytes.NewReader(grpcmsg.Frame([]byte("x")))))
			if err == nil {
				resp.Body.Close()
				return fmt.Errorf("/never answered")
			}
		}
		return nil
	}
	// One pass first, so that lazily started goroutines exist.
	for i := range 4 {
		for _, m := range []*member{owner, client} {
			if err := round(m, i); err != nil {
				t.Fatal(err)
			}
		}
	}
	if c, _ := owner.pool.Candidates(mustKey(t, owner.tr, up.url), nil); len(c) != 1 || c[0].Capacity != 4 {
		t.Fatalf("candidates %+v: want one connection of capacity 4", c)
	}
	capacityBack(t, owner, up.url)
	waitFor(t, 3*time.Second, "the upstream's handlers to end", func() bool { return up.running.Load() == 0 })
	time.Sleep(50 * time.Millisecond)
	g0 := runtime.NumGoroutine()

	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for w := range 8 {
		m := []*member{owner, client}[w%2]
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 24 {
				if err := round(m, i+w); err != nil {
					errs <- fmt.Errorf("worker %d call %d (kind %d): %w", w, i, (i+w)%4, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	capacityBack(t, owner, up.url)
	waitFor(t, 3*time.Second, "the upstream's handlers to end", func() bool { return up.running.Load() == 0 })
	goroutinesBackTo(t, g0)
	if s := client.node.Stats(); s.ReusedRemote == 0 {
		t.Errorf("sibling %+v: want its requests through the owner", s)
	}
}
