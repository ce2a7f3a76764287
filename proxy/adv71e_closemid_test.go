package proxy

import (
	"testing"
	"time"
)

// TestAdv71ePlainCloseMidExchangeNoRetrySafe: a sibling's POST has reached
// the upstream through its owner (the upstream holds its answer) when the
// owner's Node closes without a drain. Its stream carries an exchange: it
// must get no closing refusal. The sibling's RoundTrip must fail with an
// error that is not retry-safe (or succeed), and the upstream must see the
// POST once, also after the hold ends.
func TestAdv71ePlainCloseMidExchangeNoRetrySafe(t *testing.T) {
	u := newHangUpstream(t)
	owner, client := remotePair(t, nil)
	warm(t, owner, u.srv.URL+"/warm")
	done := sendAsync(client.tr, postOnce(u.srv.URL+"/hang", "mid"))
	select {
	case <-u.arrived:
	case <-time.After(5 * time.Second):
		t.Fatal("the POST did not reach the upstream")
	}
	if client.node.Stats().ReusedRemote != 1 {
		t.Fatalf("the POST did not go through the owner: %+v", client.node.Stats())
	}
	closed := make(chan error, 1)
	go func() { closed <- owner.node.Close() }()
	var r roundTripResult
	select {
	case r = <-done:
	case <-time.After(8 * time.Second):
		close(u.release)
		t.Fatal("the POST hung")
	}
	close(u.release)
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("Close hung")
	}
	time.Sleep(100 * time.Millisecond)
	if n := u.count("POST mid"); n != 1 {
		t.Fatalf("the upstream saw the POST %d times (sibling: %q, %v)", n, r.body, r.err)
	}
	if r.err != nil && IsRetrySafe(r.err) {
		t.Fatalf("the sibling got a retry-safe error for a POST the upstream had: %v", r.err)
	}
}
