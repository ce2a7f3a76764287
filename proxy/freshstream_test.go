package proxy

import (
	"context"
	"io"
	"testing"
)

// TestFreshStreamBrokenKeepsOffOwner: an owner whose listener still takes
// dials but whose streams break before it answers (a dying process, whose
// lane still looks alive) costs a request one attempt, not all of them: the
// request's later attempts keep off that owner's connections and make one
// of their own within the budget. The owner here refuses every stream as
// over its per-peer cap, which breaks each fresh stream the same way.
func TestFreshStreamBrokenKeepsOffOwner(t *testing.T) {
	u := newTestUpstream(t)
	owner, client := budgetFleet(t, NodeOptions{}, func(tr *Transport) { tr.MaxConnsPerKey = 2 })
	owner.node.srv.mu.Lock()
	owner.node.srv.maxIdlePerPeer = 0
	owner.node.srv.mu.Unlock()
	warm(t, owner, u.url("/cl"))

	resp, err := get(t, context.Background(), client.tr, u.url("/cl"))
	if err != nil {
		t.Fatalf("a request whose owner broke its fresh stream was not served another way: %v (client %+v)", err, client.node.Stats())
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	st := client.node.Stats()
	if st.ReusedRemote != 1 || st.Created != 1 {
		t.Fatalf("want one attempt through the owner, then a connection of the client's own: %+v", st)
	}
}
