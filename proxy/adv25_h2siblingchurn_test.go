package proxy

import (
	"net/http"
	"sync/atomic"
	"testing"
	"time"
)

// alternate sends each request through the next of its transports.
type alternate struct {
	rts []http.RoundTripper
	n   atomic.Int64
}

func (a *alternate) RoundTrip(req *http.Request) (*http.Response, error) {
	return a.rts[int(a.n.Add(1))%len(a.rts)].RoundTrip(req)
}

// TestAdv25H2LimitLoweredToCallersSiblings is
// TestH2LimitLoweredToCallersUnderChurn with the callers' requests sent by
// the owner and its sibling in turn: the four streams wanted fit the
// lowered limit of 4 on the owner's connection, and no request may fail or
// dial a second connection.
func TestAdv25H2LimitLoweredToCallersSiblings(t *testing.T) {
	for round := range 5 {
		owner, client := remotePair(t, func(tr *Transport) { tr.H2C = true; tr.MaxConnsPerKey = 4 })
		_ = time.Second
		testH2LimitLoweredChurn(t, &alternate{rts: []http.RoundTripper{owner.tr, client.tr}}, round)
	}
}
