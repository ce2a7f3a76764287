package proxy

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"
)

// TestAdv75bAbortedJoinDuringLeave: a key capped at one connection, owned
// by a member that leaves by Shutdown (time to spare) while a stable
// member's requests queue for the connection, and a joining member, whose
// own requests also queue, is lost (Close, then its pool) at the same
// moment: the unit the leaving owner hands on may go to the lost joiner's
// waiter. Eight rounds. Property: every one of the stable member's
// requests succeeds with its own answer, no POST twice, and the table is
// quiet at the end.
func TestAdv75bAbortedJoinDuringLeave(t *testing.T) {
	u := newAdv75bUpstream(t, nil)
	u.delay = func() time.Duration { return 10 * time.Millisecond }
	spec, obs := observedSegment(t)
	conf := func(tr *Transport) { tr.MaxConnsPerKey = 1 }
	old := newMember(t, spec, conf)
	req, _ := http.NewRequest("GET", u.srv.URL+"/?q=own", nil)
	if resp, err := old.tr.RoundTrip(req); err == nil {
		drain(resp)
	}
	s := newMember(t, spec, conf)
	load := startAdv75bLoad(t, u, "a", 8*time.Second, map[*member]int{s: 4})
	for round := range 8 {
		time.Sleep(60 * time.Millisecond)
		joiner := newMember(t, spec, conf)
		next := newMember(t, spec, conf)
		var wg sync.WaitGroup
		for range 3 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
				defer cancel()
				req, _ := http.NewRequestWithContext(ctx, "GET", u.srv.URL+"/?q=joiner", nil)
				if resp, err := joiner.tr.RoundTrip(req); err == nil {
					drain(resp)
				}
			}()
		}
		time.Sleep(time.Duration(round%4) * 5 * time.Millisecond)
		wg.Add(2)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
			defer cancel()
			old.node.Shutdown(ctx)
			old.pool.Close()
		}()
		go func() {
			defer wg.Done()
			time.Sleep(time.Duration(round%3) * 3 * time.Millisecond)
			joiner.node.Close()
			joiner.pool.Close()
		}()
		wg.Wait()
		old = next
	}
	time.Sleep(200 * time.Millisecond)
	load.stop()
	all, unsent, wrong := load.failures()
	if len(all) != 0 {
		t.Errorf("%d of %d of the stable member's requests failed (%d never reached the upstream, %d wrong): %s",
			len(all), load.sent.Load(), unsent, wrong, adv75bFirst(all, 8))
	}
	if d := u.dupPosts(); len(d) != 0 {
		t.Errorf("POSTs reached the upstream more than once: %v", d)
	}
	if load.slow.Load() != 0 {
		t.Errorf("%d requests returned past their deadline", load.slow.Load())
	}
	if load.ok.Load() < 30 {
		t.Errorf("only %d requests succeeded", load.ok.Load())
	}
	old.node.Close()
	s.node.Close()
	adv71cTableQuiet(t, obs, 5*time.Second)
}
