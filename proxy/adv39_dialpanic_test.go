package proxy

import (
	"context"
	"crypto/tls"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/backpressure"
	"github.com/orbitproxy/orbit/governor"
	"github.com/orbitproxy/orbit/orbitpool"
)

// TestAdv39PanicInDialLeavesNoDialInFlight: a panic out of a dial (here the
// Transport's TLSClientConfig.VerifyConnection, a public extension point,
// as the Policy of adv32) reaches the caller, which may recover it and
// serve on. The dial it ended is over: it must not stay counted in flight
// by the dial admission, nor hold its creation unit, or with an admission
// ceiling of one every later dial of the process is refused.
func TestAdv39PanicInDialLeavesNoDialInFlight(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	t.Cleanup(srv.Close)
	var armed atomic.Bool
	lim := backpressure.New(backpressure.WithCap(1))
	gov := governor.New(1, 0)
	m := newMemberOpts(t, orbitpool.PoolSpec{Lanes: 1, Keys: 32, ResourcesPerLane: 128},
		NodeOptions{SweepInterval: 50 * time.Millisecond, Governor: gov, Admission: governor.NewAdmission(1)},
		func(tr *Transport) {
			tr.Limiter = lim
			tr.MaxConnsPerKey = 1
			tr.TLSClientConfig = &tls.Config{
				InsecureSkipVerify: true,
				VerifyConnection: func(tls.ConnectionState) error {
					if armed.Load() {
						panic("adv39: VerifyConnection panics")
					}
					return nil
				},
			}
		})
	armed.Store(true)
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("the dial's panic did not reach the caller")
			}
		}()
		req, _ := http.NewRequest("GET", srv.URL, nil)
		m.tr.RoundTrip(req)
	}()
	armed.Store(false)
	if a, o := lim.Active(), gov.Outstanding(); a != 0 || o != 0 {
		t.Errorf("after the panic: %d permits and %d workers still held, want 0 and 0", a, o)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL, nil)
	resp, err := m.tr.RoundTrip(req)
	if err != nil {
		t.Fatalf("the request after a recovered panic in a dial: %v (dials in flight %d)", err, m.node.dialing.Load())
	}
	drain(resp)
	resp.Body.Close()
}
