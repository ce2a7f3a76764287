package proxy

import (
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	countingupstream "github.com/orbitproxy/orbit/integration/upstream"
)

// TestFailedExchangeLeavesBeforeItsBudget: an upstream that refuses
// connections past its own cap, the fleet's cap set to the same number, and
// clients that give up on a streamed response after its first chunk, while
// others wait for a connection. The connection of a failed exchange keeps
// its unit of the budget until the upstream has closed its side, as one
// retired in good order does, plain or TLS: a replacement dialed before then
// would find the upstream's cap full and be refused.
func TestFailedExchangeLeavesBeforeItsBudget(t *testing.T) {
	for _, useTLS := range []bool{false, true} {
		t.Run(fmt.Sprintf("tls=%v", useTLS), func(t *testing.T) {
			const limit, rounds = 2, 15
			up := startCappedUpstream(t, countingupstream.Options{MaxConns: limit, TLS: useTLS})
			ms := newFleet(t, 2, func(tr *Transport) {
				tr.MaxConnsPerKey = limit
				tr.TLSClientConfig = &tls.Config{RootCAs: up.CertPool}
			})
			for _, err := range capClients(ms, up.URL, rounds, 2) {
				t.Errorf("request failed: %v", err)
			}
			if st := up.Stats(); st.Refused != 0 || st.Peak > limit {
				t.Errorf("the upstream refused %d connections, and saw %d at once, with the fleet's cap at its own %d", st.Refused, st.Peak, limit)
			}
		})
	}
}

// A peer that sends what is left of its response and then closes has let
// the connection go, however much that was, up to the drain's bound; past
// the bound the connection is reset and counts as held to the end.
func TestCloseAfterPeerDrainBound(t *testing.T) {
	for _, tc := range []struct {
		name   string
		send   int
		closes bool
	}{
		{"exactly the bound, then close", maxCloseDrain, true},
		{"one byte past the bound", maxCloseDrain + 1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, done := peerPair(t, false, func(pc net.Conn, _ *net.TCPConn) {
				// After the half-close, as from a failed exchange.
				io.Copy(io.Discard, pc)
				pc.Write(make([]byte, tc.send))
				if !tc.closes {
					pc.Read(make([]byte, 1)) // until reset
				}
			})
			const wait = 2 * time.Second
			start := time.Now()
			closed := c.closeAfterPeer(wait, nil)
			took := time.Since(start)
			if closed != tc.closes {
				t.Fatalf("closeAfterPeer = %v after %d bytes, want %v", closed, tc.send, tc.closes)
			}
			if tc.closes && took > wait/2 {
				t.Errorf("a peer that closed was waited for %v", took)
			}
			if !tc.closes && took < wait {
				t.Errorf("a reset connection was given back after %v, before its wait of %v", took, wait)
			}
			<-done
		})
	}
}
