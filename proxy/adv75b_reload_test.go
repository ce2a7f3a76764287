package proxy

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/governor"
)

// TestAdv75bRapidReloadTwoStable: ten reloads 50 ms apart (a new member
// joins and makes its own connections, the old one leaves by Shutdown with
// 8s to spare, then its pool closes) under mixed GET/POST load from two
// stable members; each old member's governor has one worker, so siblings'
// heads wait for it. Property: no request fails, none gets another's
// answer, no POST reaches the upstream twice, and the table is quiet once
// every member has closed.
func TestAdv75bRapidReloadTwoStable(t *testing.T) {
	u := newAdv75bUpstream(t, nil)
	u.delay = func() time.Duration { return 3 * time.Millisecond }
	spec, obs := observedSegment(t)
	conf := func(tr *Transport) { tr.MaxConnsPerKey = 2 }
	join := func() *member {
		m := newMemberOpts(t, spec, NodeOptions{SweepInterval: 50 * time.Millisecond,
			Governor: governor.New(1, 1<<30), MaxLeaseWait: 2 * time.Second}, conf)
		// The new member's own traffic: it makes (or reuses) connections.
		for range 2 {
			req, _ := http.NewRequest("GET", u.srv.URL+"/?q=own", nil)
			if resp, err := m.tr.RoundTrip(req); err == nil {
				drain(resp)
			}
		}
		return m
	}
	old := join()
	s1 := newMember(t, spec, conf)
	s2 := newMember(t, spec, conf)
	load := startAdv75bLoad(t, u, "r", 8*time.Second, map[*member]int{s1: 4, s2: 4})
	for cycle := range 10 {
		time.Sleep(50 * time.Millisecond)
		next := join()
		ctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
		err := old.node.Shutdown(ctx)
		cancel()
		if err != nil {
			t.Errorf("cycle %d: Shutdown: %v", cycle, err)
		}
		old.pool.Close()
		old = next
	}
	time.Sleep(100 * time.Millisecond)
	load.stop()
	all, unsent, wrong := load.failures()
	if len(all) != 0 {
		t.Errorf("%d of %d requests failed across graceful reloads (%d never reached the upstream, %d wrong answers): %s",
			len(all), load.sent.Load(), unsent, wrong, adv75bFirst(all, 8))
	}
	if d := u.dupPosts(); len(d) != 0 {
		t.Errorf("POSTs reached the upstream more than once: %v", d)
	}
	if n := load.slow.Load(); n != 0 {
		t.Errorf("%d requests returned well after their own deadline", n)
	}
	if load.ok.Load() < 50 {
		t.Errorf("only %d requests succeeded: the load said nothing", load.ok.Load())
	}
	if r := s1.node.Stats().ReusedRemote + s2.node.Stats().ReusedRemote; r == 0 {
		t.Errorf("the stable members never used a sibling's connection")
	}
	old.node.Close()
	s1.node.Close()
	s2.node.Close()
	adv71cTableQuiet(t, obs, 5*time.Second)
	_ = strings.Join
}
