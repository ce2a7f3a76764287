package proxy

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestAdv73aRelayDialsWithStrayBytes: the relay-dial path under an upstream
// that now and then sends bytes after a complete response (a second
// response, a body longer than its Content-Length, the stray bytes at the
// end of full-size TLS records) or interim 103/100 first. Two processes
// loop for 1.2s relaying through a third's idle connections (uncapped, so
// relays pay for dials of their own), while the owner sends requests too.
// Every 200 must carry its own request's answer; relay dials must have
// happened (else the test proves nothing about them).
func TestAdv73aRelayDialsWithStrayBytes(t *testing.T) {
	hostile := []string{"/hints", "/stray", "/long", "/big", "/chunk"}
	for _, withTLS := range []bool{false, true} {
		for _, kill := range []bool{false, true} {
			t.Run(fmt.Sprintf("tls=%v/kill=%v", withTLS, kill), func(t *testing.T) {
				every := 5 // requests per hostile answer
				if withTLS {
					every = 50 // relays must come relaysPerTLSDial times in a row
				}
				var seen sync.Map
				u := newAdv10Upstream(t, withTLS, adv73aAnswer(&seen))
				ms := newFleet(t, 3, u.conf(nil))
				owner := ms[2]
				var wg sync.WaitGroup
				for i := range 3 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						adv73aDo(t, owner.tr, "GET", "/ok", u.base, fmt.Sprintf("warm%d", i))
					}()
				}
				wg.Wait()
				var seq, fails atomic.Int64
				stop := time.Now().Add(1200 * time.Millisecond)
				workers := 3
				if kill {
					workers = 2 // the owner only owns, and dies halfway
				}
				for w := range workers {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for i := 0; time.Now().Before(stop); i++ {
							if w == 2 {
								time.Sleep(2 * time.Millisecond)
							}
							id := fmt.Sprintf("m%dn%d", w, seq.Add(1))
							path := "/ok"
							if i%every == every-1 {
								path = hostile[(i/every+w)%len(hostile)]
							}
							if _, err := adv73aDo(t, ms[w].tr, "GET", path, u.base, id); err != nil {
								fails.Add(1)
								t.Errorf("GET %s: %v", id, err)
							}
						}
					}()
				}
				if kill {
					time.Sleep(600 * time.Millisecond)
					owner.dieAsKilled()
				}
				wg.Wait()
				rd := ms[0].node.Stats().RelayDials + ms[1].node.Stats().RelayDials
				if rd == 0 {
					t.Errorf("no relay dial happened: %+v / %+v", ms[0].node.Stats(), ms[1].node.Stats())
				}
				t.Logf("%d requests, %d relay dials", seq.Load(), rd)
			})
		}
	}
}
