package proxy

import (
	"context"
	"crypto/tls"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/backpressure"
	"github.com/orbitproxy/orbit/governor"
	"github.com/orbitproxy/orbit/orbitpool"
)

// TestAdv68cPanicInUnpooledDial: adv39's case on the unpooled path. With
// the table full, a panic out of an unpooled dial (the Transport's
// TLSClientConfig.VerifyConnection) reaches the caller, which may recover it
// and serve on; the dial is over and must not stay counted in the Node's
// dialing count, which admission adds to the open connections: under a
// ceiling one above the held connections, the next unpooled request must
// still be admitted, as on the pooled path (adv39).
func TestAdv68cPanicInUnpooledDial(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/stream" {
			io.WriteString(w, "first")
			w.(http.Flusher).Flush()
			<-release
			return
		}
		io.WriteString(w, "ok")
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(release) })
	var armed atomic.Bool
	lim := backpressure.New(backpressure.WithCap(8))
	gov := governor.New(8, 0)
	m := newMemberOpts(t, orbitpool.PoolSpec{Lanes: 1, Keys: 4, ResourcesPerLane: 2},
		NodeOptions{SweepInterval: 50 * time.Millisecond, Governor: gov, Admission: governor.NewAdmission(3)},
		func(tr *Transport) {
			tr.Limiter = lim
			tr.TLSClientConfig = &tls.Config{
				InsecureSkipVerify: true,
				VerifyConnection: func(tls.ConnectionState) error {
					if armed.Load() {
						panic("adv68c: VerifyConnection panics")
					}
					return nil
				},
			}
		})
	holdStreams(t, m, srv.URL, 2) // the table is full; open is 2
	armed.Store(true)
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("the dial's panic did not reach the caller")
			}
		}()
		req, _ := http.NewRequest("GET", srv.URL+"/x", nil)
		m.tr.RoundTrip(req)
	}()
	armed.Store(false)
	if a, o := lim.Active(), gov.Outstanding(); a != 2 || o != 2 {
		t.Errorf("after the panic: %d permits and %d workers held, want the 2 held streams'", a, o)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL+"/x", nil)
	resp, err := m.tr.RoundTrip(req)
	if err != nil {
		t.Fatalf("an unpooled request after a recovered panic in an unpooled dial: %v (open %d, dialing %d)", err, m.node.open.Load(), m.node.dialing.Load())
	}
	drain(resp)
	if d := m.node.dialing.Load(); d != 0 {
		t.Fatalf("dialing %d after every dial ended", d)
	}
}
