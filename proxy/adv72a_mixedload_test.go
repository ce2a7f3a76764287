package proxy

import (
	"net/http"
	"sync"
	"testing"
	"time"
)

// TestAdv72aMixedLoadDialsNoMoreThanStock: two processes on one uncapped
// HTTP/1.1 upstream for 2s: one with `steady` clients in a closed loop, the
// other with bursts of `burst` concurrent requests 100ms apart, which relay
// through the first's connections and then pay for dials. Stock net/http
// would hold warmConns+burst connections in all; the fleet must not exceed it.
func TestAdv72aMixedLoadDialsNoMoreThanStock(t *testing.T) {
	const steady, burst = 4, 8
	up, counts := countingUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(5 * time.Millisecond)
	}))
	ms := newFleet(t, 2, nil)
	var wg sync.WaitGroup
	// The first process starts with warm connections, more than its
	// steady clients use: the bursts find some of them idle and relay.
	const warmConns = 8
	for range warmConns {
		wg.Add(1)
		go func() { defer wg.Done(); adv10Do(t, ms[0].tr, "GET", up.URL, nil) }()
	}
	wg.Wait()
	stop := time.Now().Add(2 * time.Second)
	do := func(m *member) bool {
		if _, _, err := adv10Do(t, m.tr, "GET", up.URL, nil); err != nil {
			t.Errorf("request: %v", err)
			return false
		}
		return true
	}
	for range steady {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(stop) && do(ms[0]) {
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for time.Now().Before(stop) {
			var bw sync.WaitGroup
			for range burst {
				bw.Add(1)
				go func() { defer bw.Done(); do(ms[1]) }()
			}
			bw.Wait()
			time.Sleep(100 * time.Millisecond)
		}
	}()
	wg.Wait()
	open, peak, total := counts()
	a, b := ms[0].node.Stats(), ms[1].node.Stats()
	t.Logf("upstream: open %d peak %d total %d; created %d+%d, relayed %d+%d", open, peak, total, a.Created, b.Created, a.ReusedRemote, b.ReusedRemote)
	if total > warmConns+burst {
		t.Fatalf("fleet of %d steady + bursts of %d made %d upstream connections (stock: at most %d)", steady, burst, total, warmConns+burst)
	}
}
