package proxy

import (
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/orbitpool"
)

// TestAdv74aPaidDialRefusedByDialCap: MaxDialingPerKey 1 (a dial limit, not
// a cap, so relays pay for dials). A client relays relaysPerDial times
// through the owner's idle connection and owes a dial; meanwhile the fleet's
// one creation unit of the key is held (a sibling's dial in flight: a
// creation permit the test holds through a third lane). The client's next
// requests find the paid dial refused by the key's dial limit. Properties:
// each is served, within its deadline, through the owner's idle connection;
// the upstream sees no new connection while the unit is held (no dial past
// the fleet-wide limit); nothing of the key is left creating, waiting or
// pending besides the held permit; once the permit is given back, the
// debt is still owed: the next request, still within relayWindow, dials.
func TestAdv74aPaidDialRefusedByDialCap(t *testing.T) {
	up, counts := countingUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		io.WriteString(w, "ok")
	}))
	accepted := func() int64 { _, _, n := counts(); return n }
	ms := newFleet(t, 3, func(tr *Transport) { tr.MaxDialingPerKey = 1 })
	owner, client, holder := ms[0], ms[1], ms[2]
	warm(t, owner, up.URL)
	for i := range relaysPerDial {
		if _, _, err := adv10Do(t, client.tr, "GET", up.URL, nil); err != nil {
			t.Fatalf("relay %d: %v", i, err)
		}
	}
	req, _ := http.NewRequest("GET", up.URL, nil)
	_, key, err := client.tr.Upstream(req)
	if err != nil {
		t.Fatal(err)
	}
	permit, err := holder.pool.ClaimCreate(key, orbitpool.Limits{MaxCreating: 1})
	if err != nil {
		t.Fatalf("holding the key's creation unit: %v", err)
	}
	defer permit.Close()
	ent, err := client.tr.upstream(req)
	if err != nil {
		t.Fatal(err)
	}
	if _, count := relayState(ent.relays.Load()); count < relaysPerDial {
		t.Fatalf("setup: the client does not owe a dial")
	}
	before := accepted()
	for i := range 3 {
		ctx, cancel := contextWithTimeout(time.Second)
		req, _ := http.NewRequestWithContext(ctx, "GET", up.URL, nil)
		start := time.Now()
		resp, err := client.tr.RoundTrip(req)
		took := time.Since(start)
		cancel()
		if err != nil {
			t.Fatalf("request %d owing a dial refused by the dial limit, owner's connection idle: %v after %v (client %+v)", i, err, took.Round(time.Millisecond), client.node.Stats())
		}
		drain(resp)
		if took > 300*time.Millisecond {
			t.Errorf("request %d took %v with the owner's connection idle", i, took.Round(time.Millisecond))
		}
	}
	if n := accepted() - before; n != 0 {
		t.Errorf("the upstream accepted %d connections while the key's one dial unit was held", n)
	}
	k := adv72bKeyStats(t, client, up.URL)
	if k.Creating != 1 || k.Waiting != 0 || k.Pending != 0 || k.InUse != 0 {
		t.Errorf("key with the permit held: %+v; want only the held permit creating", k)
	}
	permit.Close()
	if _, _, err := adv10Do(t, client.tr, "GET", up.URL, nil); err != nil {
		t.Fatalf("after the permit went back: %v", err)
	}
	if st := client.node.Stats(); st.RelayDials != 1 {
		t.Errorf("after the dial limit refused the paid dials and the unit came back, relay dials %d, want 1 (the debt lost?): %+v", st.RelayDials, st)
	}
	adv72bSettled(t, client, up.URL)
}
