package proxy

import (
	"testing"
	"time"
)

// TestAdv75cShutdownDialStorm: the client sends GETs and POSTs through the
// owner with 8 workers and at most one idle stream kept (so it dials new
// streams all the time) while the owner leaves with a graceful Shutdown
// that has time to drain. No request may fail: one refused or whose dial
// found the socket gone must be retried (locally once the owner is gone),
// and one already at the owner was drained.
func TestAdv75cShutdownDialStorm(t *testing.T) {
	for round := range 3 {
		u := newAdv75bUpstream(t, nil)
		owner, client, _ := adv75cPair(t, 1)
		warm(t, owner, u.srv.URL+"/?q=warm")
		l := startAdv75bLoad(t, u, "r"+string(rune('a'+round))+"-", 10*time.Second, map[*member]int{client: 8})
		waitFor(t, 10*time.Second, "load through the owner", func() bool { return owner.node.Stats().ServedRemote > 20 })
		owner.leave("shutdown")
		time.Sleep(200 * time.Millisecond)
		l.stop()
		all, unsent, wrong := l.failures()
		if len(all) > 0 {
			t.Fatalf("round %d: %d of %d requests failed (%d never reached the upstream, %d wrong): %s",
				round, len(all), l.sent.Load(), unsent, wrong, adv75bFirst(all, 5))
		}
		if l.ok.Load() < 20 {
			t.Fatalf("round %d: only %d requests succeeded", round, l.ok.Load())
		}
	}
}

// TestAdv75cCloseDialStorm: as TestAdv75cShutdownDialStorm, but the owner
// closes at once (Close), with streams idle, refused and dialing. Requests
// under way at the owner may fail; one that never reached the upstream must
// not, and none may get another's answer (a refusal written into another
// frame, or read as the next exchange's answer).
func TestAdv75cCloseDialStorm(t *testing.T) {
	for round := range 3 {
		u := newAdv75bUpstream(t, nil)
		owner, client, _ := adv75cPair(t, 1)
		warm(t, owner, u.srv.URL+"/?q=warm")
		l := startAdv75bLoad(t, u, "c"+string(rune('a'+round))+"-", 10*time.Second, map[*member]int{client: 8})
		waitFor(t, 10*time.Second, "load through the owner", func() bool { return owner.node.Stats().ServedRemote > 20 })
		owner.leave("close")
		time.Sleep(200 * time.Millisecond)
		l.stop()
		all, unsent, wrong := l.failures()
		if unsent > 0 || wrong > 0 {
			t.Fatalf("round %d: %d of %d requests failed (%d never reached the upstream, %d wrong): %s",
				round, len(all), l.sent.Load(), unsent, wrong, adv75bFirst(all, 5))
		}
		if d := u.dupPosts(); len(d) > 0 {
			t.Fatalf("round %d: POSTs sent twice: %v", round, d)
		}
	}
}
