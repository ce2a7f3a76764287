package proxy

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/governor"
)

// TestAdv67bOwnersWaitBeforeAGoneRefusalIsTheKeysWait: the owner holds a
// sibling's request waiting for a worker (ownerWait), takes up its lease
// (Accept succeeds: the Execution is held), and only then finds the
// connection unfit (its upstream closed it meanwhile) and refuses the lease
// as gone. wait_seconds_total is documented to include "the time a
// connection's owner held a sibling's request waiting for a worker, served
// or refused"; the busy refusal's wait is counted (Node.drop), and so must
// this one be: the owner held an Execution of the key to count it with.
func TestAdv67bOwnersWaitBeforeAGoneRefusalIsTheKeysWait(t *testing.T) {
	const ownerWait = 300 * time.Millisecond
	u := newTestUpstream(t)
	url := u.url("/cl")
	gov := governor.New(1, 0)
	owner, client := budgetFleet(t, NodeOptions{Governor: gov, MaxLeaseWait: 5 * time.Second},
		func(tr *Transport) { tr.MaxConnsPerKey = 1 })
	warm(t, owner, url)
	oc := lastOwned(owner)
	if oc == nil {
		t.Fatal("setup: no owned connection")
	}
	var once sync.Once
	hook := func(c *owned) {
		if c == oc {
			// The upstream's close of the idle connection, as the
			// owner gets to it after its wait for a worker.
			once.Do(func() { c.c.raw.Close() })
		}
	}
	testHookTake.Store(&hook)
	defer testHookTake.Store(nil)

	releaseAfter(t, gov, ownerWait)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
	start := time.Now()
	resp, err := client.tr.RoundTrip(req)
	if err != nil {
		t.Fatalf("request: %v", err)
	}
	drain(resp)
	elapsed := time.Since(start)
	testHookTake.Store(nil)
	if n := owner.node.Stats().RefusedBy["gone"]; n != 1 {
		t.Fatalf("setup: the owner refused %d leases as gone, want 1: %+v", n, owner.node.Stats())
	}
	if elapsed < ownerWait*3/4 {
		t.Fatalf("setup: the request took %v, less than the owner's wait %v", elapsed, ownerWait)
	}
	if got := fleetWaitTime(t, owner); got < ownerWait*3/4 {
		t.Errorf("the fleet's wait time is %v after the owner kept the sibling's request %v waiting for a worker (its lease accepted, then refused as gone); want at least %v", got, ownerWait, ownerWait*3/4)
	}
}
