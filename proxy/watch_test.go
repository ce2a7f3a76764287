package proxy

import "testing"

// TestPeerHungUp: a stream's peer has hung up once it closed the stream, not
// while it keeps it open with bytes unread, nor when it only half-closed it
// (a tunnel's end).
func TestPeerHungUp(t *testing.T) {
	a, b := streamPair(t)
	defer a.Close()
	b.Write([]byte("unread"))
	if peerHungUp(a) {
		t.Error("hung up while the peer keeps the stream open")
	}
	b.CloseWrite()
	if peerHungUp(a) {
		t.Error("hung up when the peer only half-closed the stream")
	}
	b.Close()
	if !peerHungUp(a) {
		t.Error("not hung up once the peer closed the stream")
	}
}
