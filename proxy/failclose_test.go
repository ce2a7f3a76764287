package proxy

import (
	"crypto/tls"
	"fmt"
	"testing"

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
