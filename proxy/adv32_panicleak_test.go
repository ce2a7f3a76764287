package proxy

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/backpressure"
	"github.com/orbitproxy/orbit/governor"
	"github.com/orbitproxy/orbit/orbitpool"
)

// adv32PanicPolicy is LocalFirst, but panics while armed.
type adv32PanicPolicy struct{ armed atomic.Bool }

func (p *adv32PanicPolicy) Decide(v *orbitpool.View) orbitpool.Decision {
	if p.armed.Load() {
		panic("adv32: policy panics")
	}
	return orbitpool.LocalFirst{}.Decide(v)
}

// TestAdv32PanicInRoundTripLeaksPermit: a panic out of RoundTrip (here a
// Policy's, a public extension point; Caddy recovers handler panics and the
// process goes on serving) must not take the request's Limiter permit and
// governor lease with it. Nothing gives them back afterwards: with a cap of
// one, every later request of the process is refused.
func TestAdv32PanicInRoundTripLeaksPermit(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	t.Cleanup(srv.Close)
	lim := backpressure.New(backpressure.WithCap(1))
	gov := governor.New(4, 0)
	pol := &adv32PanicPolicy{}
	m := newMemberOpts(t, orbitpool.PoolSpec{Lanes: 1, Keys: 32, ResourcesPerLane: 128},
		NodeOptions{SweepInterval: 50 * time.Millisecond, Governor: gov}, func(tr *Transport) {
			tr.Limiter = lim
			tr.Policy = pol
		})
	pol.armed.Store(true)
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("the policy's panic did not reach the caller")
			}
		}()
		req, _ := http.NewRequest("GET", srv.URL, nil)
		m.tr.RoundTrip(req)
	}()
	pol.armed.Store(false)
	if a, o := lim.Active(), gov.Outstanding(); a != 0 || o != 0 {
		t.Errorf("after the panic: %d permits and %d workers still held, want 0 and 0", a, o)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL, nil)
	resp, err := m.tr.RoundTrip(req)
	if err != nil {
		t.Fatalf("next request: %v", err)
	}
	drain(resp)
}
