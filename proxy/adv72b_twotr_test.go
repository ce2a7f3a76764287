package proxy

import (
	"testing"
	"time"

	"github.com/orbitproxy/orbit/governor"
)

// TestAdv72bTwoTransportsOwnTheirRelays: two Transports on one Node, for
// the same upstream (one Key), one uncapped and one with MaxConnsPerKey.
// Relays counted by one never make the other dial: the capped one never
// dials for relays (its own or the uncapped one's), and the uncapped one
// dials only after relaysPerDial relays of its own, not for the capped
// one's.
func TestAdv72bTwoTransportsOwnTheirRelays(t *testing.T) {
	ms := newFleet(t, 2, nil)
	owner, client := ms[0], ms[1]
	up, accepted := adv72bHoldUpstream(t, make(chan struct{}), make(chan struct{}, 1))
	warm(t, owner, up.URL)
	capped := &Transport{Node: client.node, MaxConnsPerKey: 4}
	uncapped := client.tr
	step := func(name string, rt *Transport, n int, wantDials uint64) {
		t.Helper()
		before := client.node.Stats()
		for i := range n {
			if _, _, err := adv10Do(t, rt, "GET", up.URL, nil); err != nil {
				t.Fatalf("%s, request %d: %v", name, i, err)
			}
		}
		if d := client.node.Stats().Created - before.Created; d != wantDials {
			t.Fatalf("%s: %d requests dialed %d connections, want %d (upstream accepted %d)", name, n, d, wantDials, accepted.Load())
		}
	}
	step("uncapped relays", uncapped, relaysPerDial, 0)
	step("capped, after the uncapped one's relays", capped, 3, 0)
	step("capped relays more", capped, 2*relaysPerDial, 0)
	// The uncapped one's count: relaysPerDial, and it owes a dial.
	step("uncapped owes its dial", uncapped, 1, 1)
	if accepted.Load() != 2 {
		t.Fatalf("upstream accepted %d connections, want 2", accepted.Load())
	}
}

// TestAdv72bAdmissionRefusesOwedDial: the admission backstop refuses every
// dial of the client (its ceiling already reached by its one connection to
// another upstream). Requests owing a dial fall back to relaying, every one
// served, none evicting, and no creation permit is left on the key.
func TestAdv72bAdmissionRefusesOwedDial(t *testing.T) {
	spec := testSpec
	spec.Path = t.TempDir() + "/seg"
	owner := newMember(t, spec, nil)
	client := newMemberOpts(t, spec, NodeOptions{SweepInterval: time.Hour, Admission: governor.NewAdmission(1)}, nil)
	up, other := discardUpstream(t), discardUpstream(t)
	if _, _, err := adv10Do(t, client.tr, "GET", other.URL, nil); err != nil {
		t.Fatal(err)
	}
	warm(t, owner, up.URL)
	const requests = 3 * relaysPerDial
	for i := range requests {
		if _, _, err := adv10Do(t, client.tr, "GET", up.URL, nil); err != nil {
			t.Fatalf("request %d: %v (%+v)", i, err, client.node.Stats())
		}
	}
	st := client.node.Stats()
	if st.ReusedRemote != requests || st.Created != 1 || st.Evicted != 0 || st.DialsNotAdmitted == 0 {
		t.Fatalf("%d requests: %+v; want all relayed, the owed dials refused", requests, st)
	}
	adv72bSettled(t, client, up.URL)
}
