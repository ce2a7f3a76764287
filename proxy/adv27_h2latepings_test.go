//go:build go1.27 && !http2legacy

package proxy

import (
	"context"
	"net/http"
	"path/filepath"
	"testing"
	"time"
)

// TestAdv27LatePingUnsettledBesideLongStream: limit 2, one connection
// allowed (MaxConnsPerKey 1), the sweep at its default 1s. A long stream
// runs, quiet after its headers. A request reset on its context counts in
// the ClientConn until the peer answers its PING, which it does 60 ms late;
// meanwhile a request settles for settleWait and marks the connection
// unsettled. Once the PING is answered the reset stream is gone, and
// requests go one at a time: each has the connection's one free stream, as
// with net/http's client. A stream's end reads the state while the
// ClientConn may still count that stream; while unsettled, the capacity
// then leaves its room out, and nothing reads the state again (no frame
// comes, no stream ends) until the sweep: the next request waits for it.
func TestAdv27LatePingUnsettledBesideLongStream(t *testing.T) {
	up, release := newResetUpstream(t)
	defer release()
	spec := testSpec
	spec.Path = filepath.Join(t.TempDir(), "seg")
	m := newMemberOpts(t, spec, NodeOptions{SweepInterval: time.Second}, func(tr *Transport) { tr.H2C = true; tr.MaxConnsPerKey = 1 })
	rt := m.tr
	knowLimit(t, rt, up, 2)
	defer readLong(t, rt, up.url+"/long")()
	up.stopAnsweringPings()
	resetHanging(t, rt, up, 50*time.Millisecond)
	hc := installedH2(t, m)
	cdone := make(chan h2Outcome, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", up.url+"/", nil)
		cdone <- roundTripOutcome(rt, req)
	}()
	time.Sleep(60 * time.Millisecond)
	t.Logf("before the PING's answer: unsettled %v lingering %v capacity %d", hc.unsettled.Load(), hc.lingering.Load(), hc.loadCapacity())
	up.answerHeldPings()
	if o := <-cdone; o.err != "" {
		t.Fatalf("request while the reset stream counted: %+v", o)
	}
	slow, worst := 0, time.Duration(0)
	for range 300 {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		req, _ := http.NewRequestWithContext(ctx, "GET", up.url+"/", nil)
		o := roundTripOutcome(rt, req)
		cancel()
		if o.err != "" {
			t.Fatalf("request: %+v", o)
		}
		worst = max(worst, o.duration)
		if o.duration > 100*time.Millisecond {
			slow++
			break
		}
	}
	t.Logf("after: unsettled %v lingering %v capacity %d; %d requests over 100ms (stops at the first), worst %v; %d connections", hc.unsettled.Load(), hc.lingering.Load(), hc.loadCapacity(), slow, worst, up.nconns())
	if slow > 0 {
		t.Errorf("%d requests, one at a time beside one long stream at limit 2, took over 100ms (worst %v): the capacity left a stream that had ended out until the sweep", slow, worst)
	}
}
