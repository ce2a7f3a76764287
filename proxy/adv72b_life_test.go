package proxy

import (
	"context"
	"sync"
	"testing"
	"time"
)

// TestAdv72bOwnerLeavesWhileDialOwed: the client owes a dial (it has
// relayed relaysPerDial times through the owner's connections) and keeps
// sending concurrent GETs, some relayed through the owner, some dialing,
// when the owner Shutdowns or Closes. Every GET is served (a relay to a
// leaving owner is retried), the client ends with connections of its own
// and serves later requests on them, and nothing of the key is left
// outstanding in the client.
func TestAdv72bOwnerLeavesWhileDialOwed(t *testing.T) {
	for _, how := range []string{"shutdown", "close"} {
		t.Run(how, func(t *testing.T) {
			ms := newFleet(t, 2, nil)
			owner, client := ms[0], ms[1]
			up := discardUpstream(t)
			// Several idle connections in the owner.
			var wg sync.WaitGroup
			for range 4 {
				wg.Add(1)
				go func() { defer wg.Done(); warm(t, owner, up.URL) }()
			}
			wg.Wait()
			for i := range relaysPerDial {
				if _, _, err := adv10Do(t, client.tr, "GET", up.URL, nil); err != nil {
					t.Fatalf("relay %d: %v", i, err)
				}
			}
			errs := make(chan error, 64)
			started := make(chan struct{})
			var once sync.Once
			for range 6 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range 30 {
						if i == 3 {
							once.Do(func() { close(started) })
						}
						if _, _, err := adv10Do(t, client.tr, "GET", up.URL, nil); err != nil {
							errs <- err
							return
						}
					}
				}()
			}
			<-started
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			if how == "shutdown" {
				owner.node.Shutdown(ctx)
			} else {
				owner.node.Close()
			}
			cancel()
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatalf("a GET while the owner left: %v (client %+v)", err, client.node.Stats())
			}
			adv72bSettled(t, client, up.URL)
			before := client.node.Stats()
			for i := range 5 {
				if _, _, err := adv10Do(t, client.tr, "GET", up.URL, nil); err != nil {
					t.Fatalf("after the owner left, request %d: %v", i, err)
				}
			}
			after := client.node.Stats()
			if after.ReusedLocal-before.ReusedLocal != 5 || after.Created != before.Created {
				t.Fatalf("after the owner left, 5 sequential GETs: %d on the client's own, %d dialed (want 5, 0); client %+v",
					after.ReusedLocal-before.ReusedLocal, after.Created-before.Created, after)
			}
		})
	}
}
