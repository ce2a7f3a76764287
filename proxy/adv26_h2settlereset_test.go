//go:build go1.27 && !http2legacy

package proxy

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestAdv26SettleWithResetPending: limit 3, known; one long stream runs
// (streaming DATA, so the follower reads the state all the time); a stream
// reset on its context counts in the ClientConn for good (PINGs
// unanswered), leaving one stream of room. Requests go two at a time. A
// request offered the connection while the previous one's ended stream
// still lingers in the ClientConn reads it full and settles
// (settledState), which waits for the ClientConn to count no more streams
// than run here: with the reset stream counted for good that never comes,
// and the request waits all of settleWait (25 ms) though the lingering
// stream went within microseconds and left room. net/http's client neither
// waits nor fails: at most a few requests may take 20 ms.
func TestAdv26SettleWithResetPending(t *testing.T) {
	testSettleCost(t, []string{"net/http", "owner"}, false)
}

// TestAdv27StickyLingerPingAnswered: TestAdv26SettleWithResetPending with
// the PINGs answered, for a sibling's requests too: the reset stream goes at
// once, but a long stream runs throughout, so the ClientConn never counts
// no stream, and hc.lingering (cleared only by a reading that counts none)
// stays set. Requests going two at a time beside the long stream must not
// pay settleWait for it: at most a few take 20 ms.
func TestAdv27StickyLingerPingAnswered(t *testing.T) {
	testSettleCost(t, []string{"net/http", "owner", "sibling"}, true)
}

// testSettleCost runs requests two at a time for 1.5 s through each of
// callers, beside a long stream, after a stream was reset (its PING
// answered or not), and fails if any fails or more than a fifth wait 20 ms.
func testSettleCost(t *testing.T, callers []string, pingsAnswered bool) {
	for _, caller := range callers {
		t.Run(strings.ReplaceAll(caller, "/", "-"), func(t *testing.T) {
			stop, flow := make(chan struct{}), make(chan struct{})
			up := newRawH2(t, func(s *rawStream) {
				switch {
				case strings.HasPrefix(s.path, "/hang"):
					<-stop
				case strings.HasPrefix(s.path, "/long"):
					s.headers(false, ":status", "200")
					select {
					case <-flow:
					case <-stop:
					}
					for {
						select {
						case <-stop:
							s.data(true, nil)
							return
						default:
						}
						if s.data(false, []byte("x")) != nil {
							return
						}
						time.Sleep(50 * time.Microsecond)
					}
				default:
					s.headers(false, ":status", "200", "content-type", "text/plain")
					s.data(true, []byte("ok"))
				}
			})
			defer close(stop)
			first, rt, _ := h2Callers(t, caller, 8)
			knowLimit(t, first, up, 3) // the owner dials; a sibling's requests ride its connection
			defer readLong(t, rt, up.url+"/long")()
			if !pingsAnswered {
				up.stopAnsweringPings()
			}
			resetHanging(t, rt, up, 100*time.Millisecond)
			close(flow) // the long stream's DATA from now on: the follower reads the state all the time
			deadline := time.Now().Add(1500 * time.Millisecond)
			slow, waited, total := 0, 0, 0
			for n := 0; time.Now().Before(deadline); n++ {
				done := make(chan time.Duration, 2)
				for range 2 {
					go func() {
						ctx, cancel := context.WithTimeout(context.Background(), time.Second)
						defer cancel()
						req, _ := http.NewRequestWithContext(ctx, "GET", up.url+"/", nil)
						o := roundTripOutcome(rt, req)
						if o.err != "" {
							done <- time.Hour
							return
						}
						done <- o.duration
					}()
				}
				for range 2 {
					d := <-done
					total++
					if d > 500*time.Millisecond {
						slow++
					}
					if d >= 20*time.Millisecond {
						waited++
					}
				}
			}
			t.Logf("%d connections, %d streams opened, %d requests, %d took 20ms or more", up.nconns(), up.opens.Load(), total, waited)
			if slow > 0 {
				t.Errorf("%d requests failed or took over 500ms; %d connections", slow, up.nconns())
			}
			if waited*5 > total {
				t.Errorf("%d of %d requests took 20ms or more (settleWait is 25ms), %d connections; net/http's client dials a second one", waited, total, up.nconns())
			}
		})
	}
}
