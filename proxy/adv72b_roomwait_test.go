package proxy

import (
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/orbitpool"
)

// TestAdv72bRoomWaiterNotStarvedByOwedDials: the client's one slot holds a
// busy connection to other; a request of a capped transport (which may not
// go outside the table) to third waits for room; meanwhile a stream of the
// client's requests to up owes a dial, finds the table full and relays.
// When the connection to other goes idle, the waiter gets the room (it
// evicts it) and is served within a pause or two; the owed requests neither
// take the room from it nor fail.
func TestAdv72bRoomWaiterNotStarvedByOwedDials(t *testing.T) {
	spec := orbitpool.PoolSpec{Lanes: 2, Keys: 32, ResourcesPerLane: 1, Path: filepath.Join(t.TempDir(), "seg")}
	owner, client := newMember(t, spec, nil), newMember(t, spec, nil)
	hold, entered := make(chan struct{}), make(chan struct{}, 1)
	other, _ := adv72bHoldUpstream(t, hold, entered)
	up, third := discardUpstream(t), discardUpstream(t)
	warm(t, owner, up.URL)
	heldDone := make(chan error, 1)
	go func() {
		_, _, err := adv10Do(t, client.tr, "GET", other.URL+"/hold", nil)
		heldDone <- err
	}()
	<-entered
	for i := range relaysPerDial {
		if _, _, err := adv10Do(t, client.tr, "GET", up.URL, nil); err != nil {
			close(hold)
			t.Fatalf("relay %d: %v", i, err)
		}
	}
	capped := &Transport{Node: client.node, MaxConnsPerKey: 1}
	waiterDone := make(chan error, 1)
	go func() {
		_, _, err := adv10Do(t, capped, "GET", third.URL, nil)
		waiterDone <- err
	}()
	waitFor(t, 3*time.Second, "the capped request to wait for room", func() bool { return client.node.room.n.Load() == 1 })
	var stop atomic.Bool
	var wg sync.WaitGroup
	var owedErr atomic.Value
	wg.Add(1)
	go func() {
		defer wg.Done()
		for !stop.Load() {
			if _, _, err := adv10Do(t, client.tr, "GET", up.URL, nil); err != nil {
				owedErr.Store(err)
				return
			}
		}
	}()
	time.Sleep(50 * time.Millisecond)
	close(hold)
	if err := <-heldDone; err != nil {
		t.Fatalf("held request: %v", err)
	}
	select {
	case err := <-waiterDone:
		if err != nil {
			t.Fatalf("capped request waiting for room: %v", err)
		}
	case <-time.After(2 * time.Second):
		stop.Store(true)
		wg.Wait()
		t.Fatalf("capped request still waiting for room 2s after a slot's connection went idle; client %+v", client.node.Stats())
	}
	stop.Store(true)
	wg.Wait()
	if err, _ := owedErr.Load().(error); err != nil {
		t.Fatalf("an owed request: %v", err)
	}
	adv72bSettled(t, client, up.URL)
}
