package proxy

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"
)

// adv72bHoldUpstream serves "/hold" until hold is closed (signalling entered
// once it is in the handler) and anything else at once, counting the
// connections it accepts.
func adv72bHoldUpstream(t *testing.T, hold <-chan struct{}, entered chan<- struct{}) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	var accepted atomic.Int64
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/hold" {
			select {
			case entered <- struct{}{}:
			default:
			}
			<-hold
		}
	}))
	up.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			accepted.Add(1)
		}
	}
	up.Start()
	t.Cleanup(up.Close)
	return up, &accepted
}

// TestAdv72bSpareAdoptionPaysTheRelays: relays pay for one connection of the
// process's own. When the request they paid for finds a connection kept
// outside the table for the key (a spare) and adopts it instead of dialing,
// the process has got its connection all the same: the next shortage must
// relay relaysPerDial times again before it dials, exactly as after a real
// dial ("dial" subtest, the control). Otherwise the debt outlives the
// connection it bought and the next request that finds the process's own
// connection busy dials without a single relay paid.
func TestAdv72bSpareAdoptionPaysTheRelays(t *testing.T) {
	for _, spare := range []bool{false, true} {
		t.Run(map[bool]string{false: "dial", true: "spare"}[spare], func(t *testing.T) {
			hold, entered := make(chan struct{}), make(chan struct{}, 1)
			up, accepted := adv72bHoldUpstream(t, hold, entered)
			defer close(hold)
			ms := newFleet(t, 2, nil)
			owner, client := ms[0], ms[1]
			warm(t, owner, up.URL)
			for i := range relaysPerDial {
				if _, _, err := adv10Do(t, client.tr, "GET", up.URL, nil); err != nil {
					t.Fatalf("relay %d: %v", i, err)
				}
			}
			if st := client.node.Stats(); st.ReusedRemote != relaysPerDial || st.Created != 0 {
				t.Fatalf("setup: %+v", st)
			}
			if spare {
				req, _ := http.NewRequest("GET", up.URL, nil)
				e, err := client.tr.upstream(req)
				if err != nil {
					t.Fatal(err)
				}
				c, err := client.tr.dialer.dial(context.Background(), &e.u, func(netip.AddrPort) {})
				if err != nil {
					t.Fatal(err)
				}
				client.node.open.Add(1)
				if !client.node.spares.put(e.key, c, &client.tr.settings, 100) {
					t.Fatal("spare not kept")
				}
			}
			// The request the relays paid for: a connection of the
			// client's own (dialed, or the spare adopted).
			if _, _, err := adv10Do(t, client.tr, "GET", up.URL, nil); err != nil {
				t.Fatal(err)
			}
			if client.node.spares.len() != 0 || accepted.Load() != 2 {
				t.Fatalf("paid request: %d spares left, upstream accepted %d (want 0, 2); stats %+v", client.node.spares.len(), accepted.Load(), client.node.Stats())
			}
			before := client.node.Stats()
			// The client's own connection busy: the next request
			// finds none of its own idle, and nothing has been relayed
			// since its connection came.
			done := make(chan error, 1)
			go func() {
				_, _, err := adv10Do(t, client.tr, "GET", up.URL+"/hold", nil)
				done <- err
			}()
			t.Cleanup(func() { <-done }) // after the deferred close(hold)
			select {
			case <-entered:
			case <-time.After(3 * time.Second):
				t.Fatal("hold request never reached the upstream")
			}
			if _, _, err := adv10Do(t, client.tr, "GET", up.URL, nil); err != nil {
				t.Fatal(err)
			}
			after := client.node.Stats()
			if after.Created != before.Created || accepted.Load() != 2 || after.ReusedRemote != before.ReusedRemote+1 {
				t.Fatalf("first shortage after the paid connection came: dialed %d (want 0), relayed %d (want 1), upstream accepted %d connections (want 2)",
					after.Created-before.Created, after.ReusedRemote-before.ReusedRemote, accepted.Load())
			}
		})
	}
}
