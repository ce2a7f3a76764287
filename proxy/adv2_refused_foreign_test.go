package proxy

import (
	"context"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestAdv2RefusedForeignOrphanMakesNoRefusal: an upstream with no cap of
// its own that drops (closes without answering) requests to /drop at once,
// as a "return 444" rule does. One connection to the same address, closed
// by ANOTHER party while the upstream is busy with it, lingers: a different
// key on the same Node (a Transport with other settings), or another
// process of the same user. sock_diag sees it, but it is none of this key's
// connections closed early.
//
// With a fleet cap of 1 or 2 on this key, one GET or POST /drop must fail
// at once and be sent once (as net/http does, and as it does here with
// nothing lingering), and a healthy GET right after it must be served.
//
// Not here: this key's own given-up request, whose connection the upstream
// still holds, makes a drop at once indistinguishable from a refusal at a
// cap of 1; the drop's unit is held until the upstream lets that
// connection go, and a replayable request is sent again (see refused.go).
func TestAdv2RefusedForeignOrphanMakesNoRefusal(t *testing.T) {
	for _, tc := range []struct {
		name   string
		orphan func(t *testing.T, u *adv2Upstream, spec2 func() *member)
		method string
		cap    int
	}{
		{"noOrphan/control/GET", func(*testing.T, *adv2Upstream, func() *member) {}, "GET", 1},
		{"otherKeySameNode/GET", orphanFromOtherKey, "GET", 1},
		{"otherProcess/GET", func(t *testing.T, u *adv2Upstream, _ func() *member) { adv2ForeignOrphan(t, u) }, "GET", 1},
		{"otherProcess/POST", func(t *testing.T, u *adv2Upstream, _ func() *member) { adv2ForeignOrphan(t, u) }, "POST", 1},
		{"otherProcess/GET/cap2", func(t *testing.T, u *adv2Upstream, _ func() *member) { adv2ForeignOrphan(t, u) }, "GET", 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := startAdv2Upstream(t, 20*time.Second)
			spec := testSpec
			spec.Path = filepath.Join(t.TempDir(), "seg")
			m := newMemberOpts(t, spec, NodeOptions{SweepInterval: 50 * time.Millisecond},
				func(tr *Transport) { tr.MaxConnsPerKey = tc.cap })
			// No warm-up request: the drop goes on a new connection, as
			// the first request of a key, or one after the pool emptied.
			tc.orphan(t, up, func() *member { return m })

			path := "/drop-" + tc.method
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			start := time.Now()
			var body *strings.Reader
			if tc.method == "POST" {
				body = strings.NewReader("charge the card")
			}
			var req *http.Request
			if body != nil {
				req, _ = http.NewRequestWithContext(ctx, tc.method, up.url+path, body)
			} else {
				req, _ = http.NewRequestWithContext(ctx, tc.method, up.url+path, nil)
			}
			resp, err := m.tr.RoundTrip(req)
			if err == nil {
				resp.Body.Close()
			}
			dropTook := time.Since(start)
			cancel()

			ctx, cancel = context.WithTimeout(context.Background(), 2*time.Second)
			start = time.Now()
			okErr := getBody(ctx, m.tr, up.url+"/ok")
			okTook := time.Since(start)
			cancel()

			t.Logf("%s %s: %v after %v, sent %d times; UpstreamRefused=%d; then GET /ok: %v after %v",
				tc.method, path, err, dropTook.Round(time.Millisecond), up.count(path), m.node.Stats().UpstreamRefused, okErr, okTook.Round(time.Millisecond))
			if n := up.count(path); n != 1 {
				t.Errorf("a %s the upstream drops at once was sent %d times, want 1", tc.method, n)
			}
			if dropTook > time.Second {
				t.Errorf("a %s the upstream drops at once took %v to fail", tc.method, dropTook.Round(time.Millisecond))
			}
			if okErr != nil {
				t.Errorf("a healthy GET after it failed: %v after %v", okErr, okTook.Round(time.Millisecond))
			}
		})
	}
}

// orphanFromOtherKey: a second Transport on the same Node, with a
// different key for the same upstream address (KeyExtra: other settings)
// and no cap, whose client gives up a /hold request: its connection is
// closed here while the upstream is busy with it.
func orphanFromOtherKey(t *testing.T, u *adv2Upstream, self func() *member) {
	m := self()
	other := &Transport{Node: m.node, KeyExtra: "other-settings"}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := getBody(ctx, other, u.url+"/hold-otherkey"); err == nil {
		t.Fatal("a given-up /hold answered")
	}
	adv2WaitOrphans(t, u, 1)
}
