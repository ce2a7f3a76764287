package proxy

import (
	"context"
	"errors"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/governor"
	"github.com/orbitproxy/orbit/orbitpool"
)

type adv68cPanicBody struct{ n int }

func (b *adv68cPanicBody) Read(p []byte) (int, error) {
	if b.n > 0 {
		panic("adv68c: body Read panics")
	}
	b.n++
	return copy(p, "abc"), nil
}
func (b *adv68cPanicBody) Close() error { return nil }

// TestAdv68cBodyPanicUnpooled: with the table full, a request body whose
// Read panics mid-body (in the exchange's writer) fails that request or
// reaches the caller, without taking the process down; its unpooled
// connection is closed (the upstream reads EOF) and its admission count,
// worker and permit come back, repeatedly.
func TestAdv68cBodyPanicUnpooled(t *testing.T) {
	spec := orbitpool.PoolSpec{Lanes: 1, Keys: 4, ResourcesPerLane: 2}
	release, closed := make(chan struct{}), make(chan string, 16)
	url := adv68cUpstream(t, release, closed)
	gov := governor.New(4, 0)
	m := newMemberOpts(t, spec, NodeOptions{SweepInterval: 50 * time.Millisecond, Admission: governor.NewAdmission(3), Governor: gov}, nil)
	held := holdStreams(t, m, url, 2)
	defer func() {
		close(release)
		for _, r := range held {
			io.ReadAll(r.Body)
			r.Body.Close()
		}
	}()
	for i := range 5 {
		func() {
			defer func() { recover() }()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, "POST", url+"/sink", &adv68cPanicBody{})
			req.ContentLength = 1 << 20
			resp, err := m.tr.RoundTrip(req)
			if errors.Is(err, ErrNotAdmitted) {
				t.Fatalf("round %d: not admitted: a count leaked", i)
			}
			if err == nil {
				io.ReadAll(resp.Body)
				resp.Body.Close()
			}
		}()
		select {
		case got := <-closed:
			if got != "/sink" {
				t.Fatalf("round %d: upstream %q", i, got)
			}
		case <-time.After(6 * time.Second):
			t.Fatalf("round %d: the upstream never saw its connection end", i)
		}
		waitFor(t, 3*time.Second, "open back to 2", func() bool { return m.node.open.Load() == 2 && m.node.dialing.Load() == 0 })
	}
	if gov.Outstanding() != 2 {
		t.Fatalf("workers %d, want the 2 held", gov.Outstanding())
	}
}
