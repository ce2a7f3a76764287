package proxy

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/backpressure"
	"github.com/orbitproxy/orbit/governor"
)

// TestAdv67EndedWaitReleasesTheBudget: a request that a busy owner refuses
// and whose watcher then ends the wait gives back its admission permit and
// its worker (the client's own governor), and leaves no unit of the key
// taken: with gzip asked, a body read ahead (rewound as a new whole body)
// and none, the next request from the same client is served at once by a
// connection of its own.
func TestAdv67EndedWaitReleasesTheBudget(t *testing.T) {
	for _, body := range []string{"", "payload"} {
		t.Run("body="+body, func(t *testing.T) {
			u := newTestUpstream(t)
			spec := testSpec
			spec.Path = filepath.Join(t.TempDir(), "seg")
			ownerGov := governor.New(1, 0)
			conf := func(tr *Transport) { tr.MaxConnsPerKey = 2 }
			owner := newMemberOpts(t, spec, NodeOptions{Governor: ownerGov, MaxLeaseWait: 100 * time.Millisecond, SweepInterval: 50 * time.Millisecond}, conf)
			clientGov := governor.New(1, 0)
			lim := backpressure.New(backpressure.WithCap(1))
			client := newMemberOpts(t, spec, NodeOptions{Governor: clientGov, SweepInterval: 50 * time.Millisecond}, func(tr *Transport) {
				conf(tr)
				tr.Limiter = lim
			})
			warm(t, owner, u.url("/cl"))
			held := ownerGov.Acquire()
			defer held.Release()

			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			w := &recordWaits{retry: cancel}
			var req *http.Request
			if body == "" {
				req, _ = http.NewRequestWithContext(WithWaitWatcher(ctx, w), "GET", u.url("/cl"), nil)
			} else {
				req, _ = http.NewRequestWithContext(WithWaitWatcher(ctx, w), "POST", u.url("/cl"), bytes.NewReader([]byte(body)))
				req.Header.Set("Idempotency-Key", "1")
			}
			req.Header.Set("Accept-Encoding", "") // the transport asks for gzip itself
			resp, err := client.tr.RoundTrip(req)
			if err == nil {
				drain(resp)
				t.Fatalf("setup: served after the wait was spent (watcher told %q)", w.got())
			}
			if !errors.Is(err, ErrOwnerBusy) || !strings.HasPrefix(w.got(), "wrote retry-refused") {
				t.Fatalf("setup: %v (watcher told %q)", err, w.got())
			}
			if n := lim.Active(); n != 0 {
				t.Errorf("%d admission permits still held after RoundTrip returned", n)
			}
			if n := clientGov.Outstanding(); n != 0 {
				t.Errorf("%d of the client's workers still held after RoundTrip returned", n)
			}
			ctx2, cancel2 := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel2()
			req2, _ := http.NewRequestWithContext(ctx2, "GET", u.url("/cl"), nil)
			start := time.Now()
			resp, err = client.tr.RoundTrip(req2)
			if err != nil {
				t.Fatalf("the next request: %v (client %+v)", err, client.node.Stats())
			}
			drain(resp)
			if d := time.Since(start); d > time.Second {
				t.Errorf("the next request took %v", d)
			}
		})
	}
}
