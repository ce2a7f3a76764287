package proxy

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestAdv75bConcurrentEndsKeepBudget: an owner of a capped key's two
// connections (one busy with a sibling's slow request, one idle) is ended
// by several calls at once: two Shutdowns (one with a 30 ms drain), a
// Close, and its pool's Close, in a different order each round. No call
// may hang or panic; then the key's budget must be exactly as it was: a
// fresh pair of members under load never has more than the cap of
// connections open at the upstream, every request of theirs succeeds, and
// the table is quiet once all have closed.
func TestAdv75bConcurrentEndsKeepBudget(t *testing.T) {
	var open, maxOpen atomic.Int64
	var slow atomic.Bool
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if r.URL.Query().Get("q") == "slow" {
			time.Sleep(300 * time.Millisecond)
		} else if slow.Load() {
			time.Sleep(5 * time.Millisecond)
		}
		io.WriteString(w, "ok"+r.URL.Query().Get("q"))
	}))
	up.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		switch st {
		case http.StateNew:
			n := open.Add(1)
			for {
				m := maxOpen.Load()
				if n <= m || maxOpen.CompareAndSwap(m, n) {
					break
				}
			}
		case http.StateClosed, http.StateHijacked:
			open.Add(-1)
		}
	}
	up.Start()
	t.Cleanup(up.Close)
	spec, obs := observedSegment(t)
	const cap = 2
	conf := func(tr *Transport) { tr.MaxConnsPerKey = cap }
	ends := []func(m *member){
		func(m *member) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			m.node.Shutdown(ctx)
		},
		func(m *member) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
			defer cancel()
			m.node.Shutdown(ctx)
		},
		func(m *member) { m.node.Close() },
		func(m *member) { m.pool.Close() },
	}
	sib := newMember(t, spec, conf)
	for round := range 6 {
		owner := newMember(t, spec, conf)
		var wg sync.WaitGroup
		for range cap {
			wg.Add(1)
			go func() {
				defer wg.Done()
				req, _ := http.NewRequest("GET", up.URL+"/?q=slow", nil)
				if resp, err := owner.tr.RoundTrip(req); err == nil {
					drain(resp)
				}
			}()
		}
		wg.Wait()
		// A sibling's slow request on one of the owner's connections.
		sibDone := make(chan struct{})
		go func() {
			defer close(sibDone)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, "GET", up.URL+"/?q=slow", nil)
			if resp, err := sib.tr.RoundTrip(req); err == nil {
				drain(resp)
			}
		}()
		time.Sleep(100 * time.Millisecond)
		var ew sync.WaitGroup
		for i := range ends {
			e := ends[(i+round)%len(ends)]
			ew.Add(1)
			go func() {
				defer ew.Done()
				time.Sleep(time.Duration(i*round%4) * time.Millisecond)
				e(owner)
			}()
		}
		done := make(chan struct{})
		go func() { ew.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			t.Fatalf("round %d: ending the owner hung", round)
		}
		owner.node.Close()
		owner.pool.Close()
		<-sibDone
	}
	waitFor(t, 5*time.Second, "the upstream's connections to close", func() bool {
		sib.tr.CloseIdleConnections()
		return open.Load() == 0
	})
	// The budget is whole: two fresh members under load never exceed it.
	maxOpen.Store(0)
	slow.Store(true)
	a := newMember(t, spec, conf)
	b := newMember(t, spec, conf)
	var failed atomic.Int64
	var errs sync.Map
	var lw sync.WaitGroup
	for w := range 8 {
		lw.Add(1)
		go func() {
			defer lw.Done()
			m := a
			if w%2 == 1 {
				m = b
			}
			for i := range 20 {
				ctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
				q := fmt.Sprintf("%d-%d", w, i)
				req, _ := http.NewRequestWithContext(ctx, "GET", up.URL+"/?q="+q, nil)
				resp, err := m.tr.RoundTrip(req)
				var got []byte
				if err == nil {
					got, err = io.ReadAll(resp.Body)
					resp.Body.Close()
				}
				cancel()
				if err != nil || string(got) != "ok"+q {
					failed.Add(1)
					errs.Store(q, fmt.Sprintf("%q %v", got, err))
				}
			}
		}()
	}
	lw.Wait()
	if n := failed.Load(); n != 0 {
		var s []string
		errs.Range(func(k, v any) bool { s = append(s, fmt.Sprint(k, ": ", v)); return len(s) < 5 })
		t.Errorf("%d requests failed after the owners ended: %v", n, s)
	}
	if m := maxOpen.Load(); m > cap {
		t.Errorf("the upstream saw %d connections open at once, over the key's cap of %d: a unit of the budget was given back twice", m, cap)
	}
	if maxOpen.Load() == 0 {
		t.Errorf("no connection made")
	}
	a.node.Close()
	b.node.Close()
	sib.node.Close()
	adv71cTableQuiet(t, obs, 5*time.Second)
}
