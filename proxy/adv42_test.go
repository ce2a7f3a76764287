package proxy

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"
)

// ownerH2Conns returns the HTTP/2 connections owner holds.
func ownerH2Conns(owner *member) []*h2conn {
	var hcs []*h2conn
	for i := range owner.node.h2slots {
		if c := owner.node.h2slots[i].Load(); c != nil {
			hcs = append(hcs, c)
		}
	}
	return hcs
}

// TestAdv42H2ClosingRefusedAsBusy: a ClientConn that will take no new
// stream (a GOAWAY read, or x/net deciding not to reuse it) before the
// owner's follower or sweep has drained it in the pool is still offered
// with room. acceptH2 (since cc2c6f3) refuses a lease on it as gone only if
// hc.draining is set, which only that later read of the state sets: the
// lease is refused as busy instead. The sibling pays one of MaxRetries for
// each such connection, and keeps off the owner's lane as busy, where the
// connection is in fact gone for good. An owner whose four connections
// were all told to go away (an upstream's graceful restart) makes the
// sibling's request fail once its paid retries are spent (one here, three
// by default, and it met two or more such refusals in most runs); x/net's
// own client never picks a connection that cannot take a new request, and
// dials. Before cc2c6f3 each was refused as gone: free, and kept off.
func TestAdv42H2ClosingRefusedAsBusy(t *testing.T) {
	up := newH2Upstream(t, 1)
	ms := newFleet(t, 2, func(tr *Transport) {
		tr.H2C = true
		tr.MaxConnsPerKey = 4
		// One paid retry: a refusal as gone is free (49a155e), one as
		// busy is not.
		tr.MaxRetries = 1
	})
	owner, client := ms[0], ms[1]
	// Four concurrent streams on an upstream that allows one each: four
	// connections in the owner.
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := owner.tr.RoundTrip(grpcReq(t, context.Background(), up.url+"/slow", http.NoBody))
			if err != nil {
				t.Error(err)
				return
			}
			drain(resp)
		}()
	}
	wg.Wait()
	hcs := ownerH2Conns(owner)
	if len(hcs) != 4 {
		t.Fatalf("owner holds %d HTTP/2 connections, want 4", len(hcs))
	}
	waitFor(t, 2*time.Second, "the streams to end", func() bool {
		for _, hc := range hcs {
			if hc.active.Load() != 0 || hc.loadCapacity() == 0 {
				return false
			}
		}
		return true
	})
	// The upstream's GOAWAY as the ClientConn records it, before the
	// owner has read the state: none takes a new stream again.
	for _, hc := range hcs {
		hc.cc.SetDoNotReuse()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	resp, err := client.tr.RoundTrip(grpcReq(t, ctx, up.url+"/unary", http.NoBody))
	if err == nil {
		drain(resp)
	}
	st := owner.node.Stats()
	if err != nil {
		t.Errorf("the sibling's request failed where x/net's client dials past connections that take no new stream: %v; owner refused %v", err, st.RefusedBy)
	}
	if st.RefusedBy["busy"] != 0 {
		t.Errorf("owner refused %d leases as busy on connections that will never take a stream again (RefusedBy %v); want them refused as gone", st.RefusedBy["busy"], st.RefusedBy)
	}
}
