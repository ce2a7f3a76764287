package proxy

import (
	"context"
	"net/http"
	"runtime"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/backpressure"
	"github.com/orbitproxy/orbit/governor"
	"github.com/orbitproxy/orbit/orbitpool"
)

//go:noinline
func adv39Drop(t *testing.T, tr *Transport, url string) {
	req, _ := http.NewRequestWithContext(context.Background(), "GET", url, nil)
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp // dropped: neither read nor closed
}

// TestAdv39DroppedResponseBudgetReturned: a response the caller drops
// without closing its body holds the request's permit and worker only until
// the collector finds it (THREATS: a forgotten permit must not leak capacity
// forever), and Leaked counts it.
func TestAdv39DroppedResponseBudgetReturned(t *testing.T) {
	u := newTestUpstream(t)
	for _, path := range []string{"/big?n=3000000&cl=1", "/stall"} {
		t.Run(path, func(t *testing.T) {
			lim := backpressure.New(backpressure.WithCap(4))
			gov := governor.New(4, 0)
			m := newMemberOpts(t, orbitpool.PoolSpec{Lanes: 1, Keys: 32, ResourcesPerLane: 128},
				NodeOptions{SweepInterval: 50 * time.Millisecond, Governor: gov}, func(tr *Transport) {
					tr.Limiter = lim
				})
			adv39Drop(t, m.tr, u.url(path))
			adv39WantCollected(t, lim, gov)
		})
	}
}

func TestAdv39DroppedRemoteResponseBudgetReturned(t *testing.T) {
	u := newTestUpstream(t)
	for _, path := range []string{"/big?n=3000000&cl=1", "/stall"} {
		t.Run(path, func(t *testing.T) {
			lim := backpressure.New(backpressure.WithCap(4))
			gov := governor.New(4, 0)
			spec := testSpec
			spec.Path = t.TempDir() + "/seg"
			owner := newMemberOpts(t, spec, NodeOptions{SweepInterval: 50 * time.Millisecond}, func(tr *Transport) { tr.MaxConnsPerKey = 1 })
			client := newMemberOpts(t, spec, NodeOptions{SweepInterval: 50 * time.Millisecond, Governor: gov}, func(tr *Transport) {
				tr.MaxConnsPerKey = 1
				tr.Limiter = lim
			})
			warm(t, owner, u.url("/cl"))
			adv39Drop(t, client.tr, u.url(path))
			adv39WantCollected(t, lim, gov)
			if st := client.node.Stats(); st.Created != 0 {
				t.Errorf("client created %d", st.Created)
			}
		})
	}
}

// adv39WantCollected runs the collector until the dropped response's permit
// and lease are back, and checks each was counted as leaked once.
func adv39WantCollected(t *testing.T, lim *backpressure.Limiter, gov *governor.Governor) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for (lim.Active() != 0 || gov.Outstanding() != 0) && time.Now().Before(deadline) {
		runtime.GC()
		time.Sleep(10 * time.Millisecond)
	}
	if lim.Active() != 0 || gov.Outstanding() != 0 || lim.Leaked() != 1 || gov.Leaked() != 1 {
		t.Errorf("dropped response: Active %d, Outstanding %d, Leaked %d/%d; want 0, 0, 1/1",
			lim.Active(), gov.Outstanding(), lim.Leaked(), gov.Leaked())
	}
}
