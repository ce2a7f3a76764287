//go:build go1.27 && !http2legacy

package proxy

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestAdv27WrongClearWithResetPending: limit 2, known; a stream reset on its
// context counts in the ClientConn for good (PINGs unanswered), so the
// connection has one stream of room, and hc.lingering is set. Quick requests
// then go two at a time. One that reads the connection full settles
// (settledState), and a reading taken while a stream that ended in the
// ClientConn is still counted in hc.active (its caller has not yet run
// end), or one counted in hc.active that the ClientConn has not registered
// yet, counts no more streams than run here: lingering is cleared though
// the reset stream still counts. Then a long stream starts, the connection
// reads full at its limit, and is taken as merely full: the next request
// waits in the ClientConn for the long stream to end. net/http's client
// dials a second connection.
func TestAdv27WrongClearWithResetPending(t *testing.T) {
	for _, caller := range []string{"net/http", "owner", "sibling"} {
		t.Run(strings.ReplaceAll(caller, "/", "-"), func(t *testing.T) {
			up, release := newResetUpstream(t)
			defer release()
			var rt http.RoundTripper
			var owner *member
			switch caller {
			case "net/http":
				var p http.Protocols
				p.SetUnencryptedHTTP2(true)
				tr := &http.Transport{Protocols: &p}
				defer tr.CloseIdleConnections()
				rt = tr
			default:
				var client *member
				owner, client = remotePair(t, func(tr *Transport) { tr.H2C = true; tr.MaxConnsPerKey = 8 })
				rt = owner.tr
				if caller == "sibling" {
					// The owner dials; the sibling's requests ride its
					// connection.
					req, _ := http.NewRequest("GET", up.url+"/", nil)
					if o := roundTripOutcome(rt, req); o.err != "" {
						t.Fatalf("owner's first request: %+v", o)
					}
					rt = client.tr
				}
			}
			knowLimit(t, rt, up, 2)
			up.stopAnsweringPings()
			resetHanging(t, rt, up, 100*time.Millisecond)
			var hc *h2conn
			if owner != nil {
				hc = installedH2(t, owner)
				if !hc.lingering.Load() {
					t.Fatal("lingering not set after the reset")
				}
			}
			// Pairs of quick requests until lingering is cleared (owner), or
			// for a while.
			deadline := time.Now().Add(2 * time.Second)
			pairs, cleared := 0, false
			for time.Now().Before(deadline) && !cleared && pairs < 3000 {
				done := make(chan string, 2)
				for range 2 {
					go func() {
						ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
						defer cancel()
						req, _ := http.NewRequestWithContext(ctx, "GET", up.url+"/", nil)
						done <- roundTripOutcome(rt, req).err
					}()
				}
				for range 2 {
					if e := <-done; e != "" {
						t.Fatalf("quick request: %s", e)
					}
				}
				pairs++
				if hc != nil && !hc.lingering.Load() && !hc.unsettled.Load() {
					cleared = true
				}
			}
			t.Logf("%d pairs; lingering cleared with the reset stream still counted: %v", pairs, cleared)
			if hc != nil {
				time.Sleep(10 * time.Millisecond)
				t.Logf("state %+v active %d capacity %d", hc.cc.State(), hc.active.Load(), hc.loadCapacity())
			}
			req, _ := http.NewRequest("GET", up.url+"/long", nil)
			long, err := rt.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			defer long.Body.Close()
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			req, _ = http.NewRequestWithContext(ctx, "GET", up.url+"/", nil)
			o := roundTripOutcome(rt, req)
			t.Logf("request beside the long stream: %v err=%q; %d upstream connections", o.duration, o.err, up.nconns())
			if o.err != "" || o.duration > 500*time.Millisecond {
				t.Errorf("a request beside the long stream (limit 2, one reset stream counted for good) took %v: %q; net/http's client dials a second connection", o.duration, o.err)
			}
		})
	}
}
