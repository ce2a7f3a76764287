package proxy

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestAdv75bIdleCloseUpstreamDuringReloads: the upstream closes idle
// keep-alive connections after 30 ms, so connections are closing under
// the fleet all the time, including while owners leave. Bursty load (with
// pauses a little longer than the idle timeout) from two stable members
// through five graceful reloads. Property: no GET fails (net/http retries a
// GET whose reused connection was closed under it), no POST that never
// reached the upstream fails with anything but what net/http would also
// report, no wrong answers, no POST twice.
func TestAdv75bIdleCloseUpstreamDuringReloads(t *testing.T) {
	u := newAdv75bUpstream(t, func(s *httptest.Server) { s.Config.IdleTimeout = 30 * time.Millisecond })
	spec, obs := observedSegment(t)
	conf := func(tr *Transport) { tr.MaxConnsPerKey = 3 }
	old := newMember(t, spec, conf)
	for range 3 {
		req, _ := http.NewRequest("GET", u.srv.URL+"/?q=warm", nil)
		if resp, err := old.tr.RoundTrip(req); err == nil {
			drain(resp)
		}
	}
	s1 := newMember(t, spec, conf)
	s2 := newMember(t, spec, conf)
	var loads []*adv75bLoad
	for burst := range 10 {
		l := startAdv75bLoad(t, u, "i"+string(rune('a'+burst)), 6*time.Second, map[*member]int{s1: 3, s2: 3})
		loads = append(loads, l)
		time.Sleep(20 * time.Millisecond)
		if burst%2 == 1 {
			next := newMember(t, spec, conf)
			req, _ := http.NewRequest("GET", u.srv.URL+"/?q=own", nil)
			if resp, err := next.tr.RoundTrip(req); err == nil {
				drain(resp)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
			old.node.Shutdown(ctx)
			cancel()
			old.pool.Close()
			old = next
		}
		l.stop()
		time.Sleep(35 * time.Millisecond) // the upstream closes the idle ones now
	}
	var getFails []string
	var sent, ok int64
	for _, l := range loads {
		all, _, wrong := l.failures()
		sent += l.sent.Load()
		ok += l.ok.Load()
		if wrong != 0 {
			t.Errorf("wrong answers: %s", adv75bFirst(all, 5))
		}
		for _, f := range all {
			if strings.Contains(f, "GET ") {
				getFails = append(getFails, f)
			}
		}
	}
	if len(getFails) != 0 {
		t.Errorf("%d GETs of %d requests failed with an upstream closing idle connections: %s", len(getFails), sent, adv75bFirst(getFails, 8))
	}
	if d := u.dupPosts(); len(d) != 0 {
		t.Errorf("POSTs reached the upstream more than once: %v", d)
	}
	if ok < 50 {
		t.Errorf("only %d requests succeeded", ok)
	}
	old.node.Close()
	s1.node.Close()
	s2.node.Close()
	adv71cTableQuiet(t, obs, 5*time.Second)
}
