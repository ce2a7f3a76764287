package proxy

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/governor"
)

// TestShutdownRefusesFrameSentAsExchangeEnds: a sibling that has its
// response sends its next request on the same stream at once. An owner that
// shuts down in that instant, its last exchange over but its stream not yet
// back to waiting for a frame, must refuse that request (the sibling then
// sends it elsewhere) rather than close the stream under it, which fails a
// POST that never reached the upstream.
func TestShutdownRefusesFrameSentAsExchangeEnds(t *testing.T) {
	po := pauseOwnerAfterPOST(t)
	u, owner, client := po.u, po.owner, po.client

	// The owner's stream is between its exchange and its next frame: the
	// sibling sends that frame now, on the stream it has back.
	if client.node.Stats().IdlePeerConns != 1 {
		t.Fatalf("the sibling has no idle stream to the owner: %+v", client.node.Stats())
	}
	done := sendAsync(client.tr, postOnce(u.srv.URL+"/hang", "two"))
	waitFor(t, 2*time.Second, "the second POST to take the stream", func() bool { return client.node.Stats().IdlePeerConns == 0 })
	time.Sleep(20 * time.Millisecond) // its frame is written right after

	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	shut := make(chan error, 1)
	go func() { shut <- owner.node.Shutdown(sctx) }()
	waitServerClosed(t, owner)
	po.resume()

	select {
	case r := <-done:
		if r.err != nil || r.body != "ok" {
			t.Fatalf("a POST sent as the owner's exchange ended failed when the owner shut down: %q, %v", r.body, r.err)
		}
	case <-time.After(8 * time.Second):
		t.Fatal("the second POST hung")
	}
	if err := <-shut; err != nil {
		t.Fatal(err)
	}
	if n := u.count("POST two"); n != 1 {
		t.Fatalf("the upstream saw the second POST %d times", n)
	}
}

// pausedOwner is a hang upstream that answers at once, an owner and a
// client with one connection per key, after one POST through the owner
// whose stream is held between that exchange and its next frame.
type pausedOwner struct {
	u             *hangUpstream
	owner, client *member
	resume        func() // lets the stream go on; once is enough, more is harmless
}

func pauseOwnerAfterPOST(t *testing.T) *pausedOwner {
	t.Helper()
	u := newHangUpstream(t)
	close(u.release)
	owner, client := remotePair(t, nil)
	warm(t, owner, u.srv.URL+"/warm")

	var armed atomic.Bool
	paused, release := make(chan struct{}), make(chan struct{})
	hook := func() {
		if armed.CompareAndSwap(true, false) {
			paused <- struct{}{}
			<-release
		}
	}
	var once sync.Once
	po := &pausedOwner{u: u, owner: owner, client: client, resume: func() { once.Do(func() { close(release) }) }}
	betweenExchanges.Store(&hook)
	t.Cleanup(func() {
		po.resume()
		betweenExchanges.Store(nil)
	})
	armed.Store(true)
	if r := <-sendAsync(client.tr, postOnce(u.srv.URL+"/hang", "one")); r.err != nil || r.body != "ok" {
		t.Fatalf("first POST: %q, %v", r.body, r.err)
	}
	select {
	case <-paused:
	case <-time.After(5 * time.Second):
		t.Fatal("the owner's stream did not finish its exchange")
	}
	return po
}

// waitServerClosed waits until m's server has closed its streams.
func waitServerClosed(t *testing.T, m *member) {
	t.Helper()
	waitFor(t, 2*time.Second, "the owner to close its streams", func() bool {
		m.node.srv.mu.Lock()
		defer m.node.srv.mu.Unlock()
		return m.node.srv.closed
	})
}

// TestShutdownEndsWaitForWorker: a sibling's request waiting for a worker
// of the owner's budget when the owner's drain times out is refused as the
// owner closes, and its wait ends there: close does not wait for it, which
// would hold the worker's exit up to MaxLeaseWait.
func TestShutdownEndsWaitForWorker(t *testing.T) {
	u := newHangUpstream(t)
	close(u.release)
	gov := governor.New(1, 0)
	const leaseWait = 5 * time.Second
	owner, client := budgetFleet(t, NodeOptions{Governor: gov, MaxLeaseWait: leaseWait},
		// A cap of the owner's one connection: a POST dials its own
		// connection while the cap allows.
		func(tr *Transport) { tr.MaxConnsPerKey = 1 })
	warm(t, owner, u.srv.URL+"/warm")
	held := gov.Acquire()
	defer held.Release()

	done := sendAsync(client.tr, postOnce(u.srv.URL+"/hang", "once"))
	waitFor(t, 2*time.Second, "the POST to wait on the owner", func() bool { return client.node.Stats().ReusedRemote == 1 })
	time.Sleep(50 * time.Millisecond)
	start := time.Now()
	sctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := owner.node.Shutdown(sctx); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > leaseWait/2 {
		t.Fatalf("shutdown waited %s for a request waiting for a worker (MaxLeaseWait %s)", d, leaseWait)
	}
	select {
	case r := <-done:
		if r.err != nil || r.body != "ok" {
			t.Fatalf("a POST refused by a closing owner before it reached the upstream: %q, %v", r.body, r.err)
		}
	case <-time.After(8 * time.Second):
		t.Fatal("the POST hung")
	}
	if n := u.count("POST once"); n != 1 {
		t.Fatalf("the upstream saw the POST %d times", n)
	}
}
