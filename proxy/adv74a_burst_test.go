package proxy

import (
	"io"
	"net/http"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestAdv74aOneDebtOneDial: ski rental buys one dial per relaysPerDial
// relays (see claimDial: "its next request that finds no idle connection of
// its own should dial one"). The owner holds 16 idle connections; the client
// relays relaysPerDial times and owes one dial; then a burst of 16
// concurrent requests arrives, every one of which a sibling's idle
// connection could serve. Property: the one debt buys at most one dial (the
// others relay, as the relays before them did); the client must not dial a
// connection for every request of the burst on the strength of one debt.
// Each burst request takes 100ms upstream, so no relay of the burst ends
// (and counts toward a new debt) before every request of it has decided.
// It failed 1 to 3 runs in 10 when the debt was read as each request began
// and spent only when one reached its dial: requests that began in between
// all dialed (claimDial takes it now).
func TestAdv74aOneDebtOneDial(t *testing.T) {
	up, counts := countingUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if r.URL.Path == "/slow" {
			time.Sleep(100 * time.Millisecond)
		}
		io.WriteString(w, "ok")
	}))
	accepted := func() int64 { _, _, n := counts(); return n }
	spec := testSpec
	spec.Path = filepath.Join(t.TempDir(), "seg")
	owner := newMember(t, spec, nil)
	client := newMember(t, spec, nil)
	burst := func(m *member, n int) int32 {
		var wg sync.WaitGroup
		var fails atomic.Int32
		for range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, _, err := adv10Do(t, m.tr, "GET", up.URL+"/slow", nil); err != nil {
					fails.Add(1)
					t.Errorf("burst request: %v", err)
				}
			}()
		}
		wg.Wait()
		return fails.Load()
	}
	burst(owner, 16)
	if n := owner.node.Stats().OpenConns; n < 16 {
		t.Fatalf("setup: owner holds %d connections, want 16", n)
	}
	for i := range relaysPerDial {
		if _, _, err := adv10Do(t, client.tr, "GET", up.URL, nil); err != nil {
			t.Fatalf("relay %d: %v", i, err)
		}
	}
	if st := client.node.Stats(); st.Created != 0 || st.ReusedRemote != relaysPerDial {
		t.Fatalf("setup: client %+v", st)
	}
	before := accepted()
	burst(client, 16)
	st := client.node.Stats()
	t.Logf("client after the burst: created %d, relay dials %d, relayed %d; upstream accepted %d new", st.Created, st.RelayDials, st.ReusedRemote-relaysPerDial, accepted()-before)
	if st.RelayDials > 1 || st.Created > 1 {
		t.Errorf("one debt of %d relays bought %d dials (%d created) for a burst of 16 that the owner's 16 idle connections could serve", relaysPerDial, st.RelayDials, st.Created)
	}
}
