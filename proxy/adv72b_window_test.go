package proxy

import (
	"sync"
	"testing"
	"time"
)

// TestAdv72bConcurrentRelaysAllCount: a burst of relays that come at once
// after a quiet spell (longer than relayWindow) are all within relayWindow
// of each other, so each must count: a burst of 4*relaysPerDial concurrent
// relays leaves the process owing a dial. relayed's Swap-then-Store lets
// the one relay that saw the quiet spell reset the count to 1 after the
// others have added theirs.
func TestAdv72bConcurrentRelaysAllCount(t *testing.T) {
	const burst = 4 * relaysPerDial
	e := &upstreamEntry{u: upstream{Scheme: "http"}}
	lost, worst := 0, int32(burst)
	const rounds = 5000
	for range rounds {
		e.relays.Store(0)
		e.lastRelay.Store(sinceStart(time.Now()) - int64(2*relayWindow))
		var start, wg sync.WaitGroup
		start.Add(1)
		for range burst {
			wg.Add(1)
			go func() {
				defer wg.Done()
				start.Wait()
				e.relayed()
			}()
		}
		start.Done()
		wg.Wait()
		if n := e.relays.Load(); n != burst {
			lost++
			worst = min(worst, n)
		}
	}
	if lost > 0 {
		t.Fatalf("%d of %d bursts of %d concurrent relays after a quiet spell counted fewer (as few as %d); owesDial after the fewest: %v",
			lost, rounds, burst, worst, worst >= relaysPerDial)
	}
}

// TestAdv72bSparseConcurrentNoDebt: relays that never come within
// relayWindow of each other never add up, however many goroutines count
// them: each is the first of its window.
func TestAdv72bSparseRelaysNoDebt(t *testing.T) {
	e := &upstreamEntry{u: upstream{Scheme: "http"}}
	for i := range 3 * relaysPerDial {
		e.lastRelay.Store(sinceStart(time.Now()) - int64(relayWindow) - int64(time.Millisecond))
		e.relayed()
		if e.owesDial(false) {
			t.Fatalf("relay %d, each more than relayWindow after the one before: a dial is owed (relays %d)", i, e.relays.Load())
		}
	}
}
