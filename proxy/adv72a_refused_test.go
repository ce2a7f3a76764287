package proxy

import (
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
)

// TestAdv72aRefusedDialAfterRelaysStillServed: after relaysPerDial relays the
// client owes a dial; the upstream stops accepting (its listener is closed,
// its open connections still serve). Every request must still be served,
// through the owner's connection, as before the change: a refused dial that
// relays paid for falls back to LocalFirst.
func TestAdv72aRefusedDialAfterRelaysStillServed(t *testing.T) {
	for _, maxDialing := range []int{0, 1} {
		t.Run(map[int]string{0: "unlimited", 1: "max-dialing-1"}[maxDialing], func(t *testing.T) {
			adv72aRefused(t, maxDialing)
		})
	}
}

func adv72aRefused(t *testing.T, maxDialing int) {
	var accepted atomic.Int64
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	up.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			accepted.Add(1)
		}
	}
	up.Start()
	t.Cleanup(up.Close)
	ms := newFleet(t, 2, func(tr *Transport) { tr.MaxDialingPerKey = maxDialing })
	owner, client := ms[0], ms[1]
	warm(t, owner, up.URL)
	up.Listener.Close() // refuse new connections; the owner's keeps serving
	const requests = 3 * relaysPerDial
	for i := range requests {
		if _, _, err := adv10Do(t, client.tr, "GET", up.URL, nil); err != nil {
			t.Fatalf("request %d: %v (client stats %+v)", i, err, client.node.Stats())
		}
	}
	st := client.node.Stats()
	if st.ReusedRemote != requests || st.Created != 0 || accepted.Load() != 1 {
		t.Fatalf("%d requests: %d relayed, %d created; upstream accepted %d", requests, st.ReusedRemote, st.Created, accepted.Load())
	}
}
