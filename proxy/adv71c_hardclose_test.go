package proxy

import (
	"testing"
	"time"

	"github.com/orbitproxy/orbit/governor"
)

// TestAdv71cHardCloseWhileWaitingForWorker: a sibling's POST waits on its
// owner for a worker of the owner's budget (its frame and head read, its
// body held back until an accept that never came) when the owner's Node
// closes without a drain (Node.Close). Nothing of the POST reached the
// upstream, and the owner knows it (the stream carries no exchange): the
// sibling must serve it another way, as it does when a draining owner
// closes (TestShutdownEndsWaitForWorker) and when the owner never read the
// frame (TestAdv6LifeCloseUnreadPOSTRetried); THREATS "Stale streams":
// failures before any byte reached the upstream are retried whatever the
// method.
func TestAdv71cHardCloseWhileWaitingForWorker(t *testing.T) {
	u := newHangUpstream(t)
	close(u.release)
	gov := governor.New(1, 0)
	owner, client := budgetFleet(t, NodeOptions{Governor: gov, MaxLeaseWait: 5 * time.Second},
		func(tr *Transport) { tr.MaxConnsPerKey = 1 })
	warm(t, owner, u.srv.URL+"/warm")
	held := gov.Acquire()
	defer held.Release()

	done := sendAsync(client.tr, postOnce(u.srv.URL+"/hang", "once"))
	waitFor(t, 2*time.Second, "the POST to wait on the owner", func() bool { return client.node.Stats().ReusedRemote == 1 })
	time.Sleep(100 * time.Millisecond) // the owner has read the frame and head, and waits for a worker
	closed := make(chan error, 1)
	go func() { closed <- owner.node.Close() }()
	select {
	case r := <-done:
		if r.err != nil || r.body != "ok" {
			t.Errorf("a POST its owner closed on before taking it up failed: %q, %v (retry-safe %v; the upstream saw it %d times)", r.body, r.err, IsRetrySafe(r.err), u.count("POST once"))
		}
	case <-time.After(8 * time.Second):
		t.Error("the POST hung")
	}
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("Close hung")
	}
	if n := u.count("POST once"); n > 1 {
		t.Fatalf("the upstream saw the POST %d times", n)
	}
}
