package proxy

import (
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestAdv72aDialsBoundedByConcurrency: the owner holds `conc` idle
// connections; the client then runs `conc` clients in a closed loop for
// 1.5s, so it relays, owes dials, and dials. Like net/http's pool, a process
// must never hold more connections than its peak concurrency: the upstream
// sees at most 2*conc connections in all (the owner's and the client's), and
// every request is served.
func TestAdv72aDialsBoundedByConcurrency(t *testing.T) {
	for _, maxDialing := range []int{0, 1} {
		t.Run(map[int]string{0: "unlimited", 1: "max-dialing-1"}[maxDialing], func(t *testing.T) {
			adv72aGrowth(t, maxDialing)
		})
	}
}

func adv72aGrowth(t *testing.T, maxDialing int) {
	const conc = 8
	up, counts := countingUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(2 * time.Millisecond)
	}))
	ms := newFleet(t, 2, func(tr *Transport) { tr.MaxDialingPerKey = maxDialing })
	owner, client := ms[0], ms[1]
	var wg sync.WaitGroup
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, _, err := adv10Do(t, owner.tr, "GET", up.URL, nil); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	_, _, ownerTotal := counts()
	var served, failed atomic.Int64
	stop := time.Now().Add(1500 * time.Millisecond)
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(stop) {
				if _, _, err := adv10Do(t, client.tr, "GET", up.URL, nil); err != nil {
					failed.Add(1)
					t.Errorf("client request: %v", err)
					return
				}
				served.Add(1)
			}
		}()
	}
	wg.Wait()
	open, peak, total := counts()
	st := client.node.Stats()
	t.Logf("owner dialed %d; upstream: %d open, peak %d, total %d; client: served %d, relayed %d, created %d, local %d", ownerTotal, open, peak, total, served.Load(), st.ReusedRemote, st.Created, st.ReusedLocal)
	if st.Created > conc || total > ownerTotal+conc {
		t.Fatalf("client with %d concurrent requests dialed %d connections; upstream accepted %d (owner's %d)", conc, st.Created, total, ownerTotal)
	}
}
