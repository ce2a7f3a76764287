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
// from a listener put at its socket's path in place of its own, which
// accepts every stream and closes it unanswered. (An owner over its per-peer
// cap of idle streams no longer breaks a fresh stream that brings its frame:
// see serveConn.)
func TestFreshStreamBrokenKeepsOffOwner(t *testing.T) {
	u := newTestUpstream(t)
	owner, client := budgetFleet(t, NodeOptions{}, func(tr *Transport) { tr.MaxConnsPerKey = 2 })
	warm(t, owner, u.url("/cl"))
	path := SocketPath(SocketDir(owner.pool.Spec().Path), owner.pool.Lane())
	owner.node.srv.ln.Close() // and the socket file with it
	ln, err := listenUnix(path)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() {
		ln.Close()
		<-done
	})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()

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
