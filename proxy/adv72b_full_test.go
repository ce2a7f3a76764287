package proxy

import (
	"net/http"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/orbitpool"
)

// adv72bKeyStats is the snapshot of m's pool for the key of url.
func adv72bKeyStats(t *testing.T, m *member, url string) orbitpool.KeyStats {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	_, key, err := m.tr.Upstream(req)
	if err != nil {
		t.Fatal(err)
	}
	s, err := m.pool.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range s.Keys {
		if k.Key == key {
			return k
		}
	}
	return orbitpool.KeyStats{}
}

// adv72bFullPair: one slot per lane; the client's holds an idle connection
// to other; the owner's one connection to up is warm; the client has
// relayed relaysPerDial times, so it owes a dial.
func adv72bFullPair(t *testing.T) (owner, client *member, upURL string) {
	t.Helper()
	spec := orbitpool.PoolSpec{Lanes: 2, Keys: 32, ResourcesPerLane: 1, Path: filepath.Join(t.TempDir(), "seg")}
	owner, client = newMember(t, spec, nil), newMember(t, spec, nil)
	up, other := discardUpstream(t), discardUpstream(t)
	if _, _, err := adv10Do(t, client.tr, "GET", other.URL, nil); err != nil {
		t.Fatal(err)
	}
	warm(t, owner, up.URL)
	for i := range relaysPerDial {
		if _, _, err := adv10Do(t, client.tr, "GET", up.URL, nil); err != nil {
			t.Fatalf("relay %d: %v", i, err)
		}
	}
	return owner, client, up.URL
}

// adv72bSettled waits until nothing of url's key is outstanding in the
// client: no creation permit, no waiter parked, no lease unaccepted, no
// user, no request queued for room, and n.open matches what is held.
func adv72bSettled(t *testing.T, client *member, url string) {
	t.Helper()
	waitFor(t, 3*time.Second, "the key to settle", func() bool {
		k := adv72bKeyStats(t, client, url)
		return k.Creating == 0 && k.Waiting == 0 && k.Pending == 0 && k.InUse == 0
	})
	if n := client.node.room.n.Load(); n != 0 {
		t.Fatalf("%d requests still queued for room", n)
	}
	if o, h := adv70Counted(client); o != int64(h) {
		t.Fatalf("n.open %d, %d held (table and spares)", o, h)
	}
}

// TestAdv72bFullTableFreeSlotTaken: requests owing a dial on a full table
// relay (no eviction), leave nothing outstanding, and once the slot is free
// again the next one, still within relayWindow, takes it: the debt is not
// lost to the fallback, and the free slot is not left unused.
func TestAdv72bFullTableFreeSlotTaken(t *testing.T) {
	_, client, up := adv72bFullPair(t)
	for i := range 6 {
		if _, _, err := adv10Do(t, client.tr, "GET", up, nil); err != nil {
			t.Fatalf("request %d owing a dial on a full table: %v", i, err)
		}
	}
	if st := client.node.Stats(); st.Evicted != 0 || st.Created != 1 || st.ReusedRemote != relaysPerDial+6 {
		t.Fatalf("full table: %+v; want every request relayed, nothing evicted", st)
	}
	adv72bSettled(t, client, up)
	client.tr.CloseIdleConnections()
	waitFor(t, 3*time.Second, "the client's slot to free", func() bool { o, h := adv70Counted(client); return o == 0 && h == 0 })
	// The slot goes back to the lane's free list a moment after the
	// connection is counted out. The debt may have lapsed meanwhile on a
	// loaded machine (relayWindow): within relaysPerDial more relays it is
	// owed again, and the free slot must be taken by then.
	time.Sleep(relayWindow / 4)
	before := client.node.Stats()
	for i := 0; i <= relaysPerDial && client.node.Stats().Created == before.Created; i++ {
		if _, _, err := adv10Do(t, client.tr, "GET", up, nil); err != nil {
			t.Fatal(err)
		}
	}
	after := client.node.Stats()
	if after.Created != before.Created+1 || after.Evicted != 0 {
		t.Fatalf("requests owing a dial, with a slot free again: dialed %d, relayed %d, evicted %d (want one dial)", after.Created-before.Created, after.ReusedRemote-before.ReusedRemote, after.Evicted)
	}
	if k := adv72bKeyStats(t, client, up); k.Live != 2 || k.Creating != 0 {
		t.Fatalf("key of up after the dial: %+v", k)
	}
	adv72bSettled(t, client, up)
}

// TestAdv72bFullTableBurstLeaksNothing: concurrent requests owing a dial on
// a full table (the owner's one connection serves one at a time, so some
// find it busy and go on to LocalFirst's eviction or an unpooled dial, as
// before the change). None fails, and afterwards nothing is outstanding.
func TestAdv72bFullTableBurstLeaksNothing(t *testing.T) {
	_, client, up := adv72bFullPair(t)
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 10 {
				if _, _, err := adv10Do(t, client.tr, "GET", up, nil); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("a request owing a dial on a full table: %v", err)
	}
	adv72bSettled(t, client, up)
	client.tr.CloseIdleConnections()
	waitFor(t, 3*time.Second, "every connection of the client to close", func() bool { o, h := adv70Counted(client); return o == 0 && h == 0 })
	waitFor(t, 3*time.Second, "the key to hold only the owner's connection", func() bool {
		k := adv72bKeyStats(t, client, up)
		return k.Live == 1 && k.Creating == 0 && k.Busy == 0
	})
}
