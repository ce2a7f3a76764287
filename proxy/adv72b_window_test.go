package proxy

import (
	"sync"
	"testing"
	"time"
)

// TestAdv72bConcurrentRelaysAllCount: a burst of relays that come at once
// after a quiet spell (longer than relayWindow) are all within relayWindow
// of each other, so each must count: a burst of 4*relaysPerDial concurrent
// relays leaves the process owing a dial. With the count and the time of
// the last relay in two words, the one relay that saw the quiet spell could
// reset the count to 1 after the others had added theirs.
func TestAdv72bConcurrentRelaysAllCount(t *testing.T) {
	const burst = 4 * relaysPerDial
	e := &upstreamEntry{u: upstream{Scheme: "http"}}
	lost, worst := 0, uint64(burst)
	const rounds = 5000
	now := sinceStart(time.Now())
	for range rounds {
		e.relayedAt(now)
		now += int64(2 * relayWindow)
		var start, wg sync.WaitGroup
		start.Add(1)
		for range burst {
			wg.Add(1)
			go func() {
				defer wg.Done()
				start.Wait()
				e.relayedAt(now)
			}()
		}
		start.Done()
		wg.Wait()
		if _, n := relayState(e.relays.Load()); n != burst {
			lost++
			worst = min(worst, n)
		}
		now += int64(2 * relayWindow)
	}
	if lost > 0 {
		t.Fatalf("%d of %d bursts of %d concurrent relays after a quiet spell counted fewer (as few as %d)", lost, rounds, burst, worst)
	}
}

// TestAdv72bSparseRelaysNoDebt: relays that never come within relayWindow
// of each other never add up: each is the first of its window.
func TestAdv72bSparseRelaysNoDebt(t *testing.T) {
	e := &upstreamEntry{u: upstream{Scheme: "http"}}
	now := sinceStart(time.Now())
	for i := range 3 * relaysPerDial {
		e.relayedAt(now)
		if _, n := relayState(e.relays.Load()); n != 1 {
			t.Fatalf("relay %d, each more than relayWindow after the one before: counted %d", i, n)
		}
		now += int64(relayWindow + time.Millisecond)
	}
}
