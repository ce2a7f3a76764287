package proxy

import (
	"context"
	"math"
	"net/http"
	"testing"
	"time"
)

// TestAdv67EncodedWaitLeftDecodes: every frame the caller's encoder writes
// is one the owner's decoder takes. The decoder refuses a wait left past
// maxFrameWait (about 146 years) as ErrBadFrame, and a longer wait (a
// wait_timeout set very large to mean "as long as it takes", or a
// WaitWatcher that says math.MaxInt64 for "no bound") goes as that bound.
func TestAdv67EncodedWaitLeftDecodes(t *testing.T) {
	for _, w := range []time.Duration{maxFrameWait, maxFrameWait + 1, 200 * 365 * 24 * time.Hour, math.MaxInt64} {
		b, err := appendRequestFrameWait(nil, []byte("lease"), time.Time{}, flagBodyOnAccept, -1, w)
		if err != nil {
			t.Fatalf("a wait left of %v: %v", w, err)
		}
		f, _, err := decodeRequestFrame(b)
		if err != nil {
			t.Errorf("a wait left of %v encodes to a frame the owner refuses: %v", w, err)
		} else if f.waitLeft != maxFrameWait {
			t.Errorf("a wait left of %v decodes as %d, want %d", w, f.waitLeft, int64(maxFrameWait))
		}
	}
}

// TestAdv67HugeWaitLeftIsServed: end to end, a sibling's request whose
// watcher reports a wait left of math.MaxInt64 (or 200 years: a
// wait_timeout the Caddy module accepts, having no upper bound) is served
// by a sibling's idle connection, as one without a watcher is.
func TestAdv67HugeWaitLeftIsServed(t *testing.T) {
	u := newTestUpstream(t)
	owner, client := remotePair(t, nil)
	warm(t, owner, u.url("/cl"))
	for _, left := range []time.Duration{200 * 365 * 24 * time.Hour, math.MaxInt64} {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		w := &recordWaits{left: left}
		req, _ := http.NewRequestWithContext(WithWaitWatcher(ctx, w), "GET", u.url("/cl"), nil)
		resp, err := client.tr.RoundTrip(req)
		cancel()
		if err != nil {
			t.Errorf("wait left %v: %v (watcher told %q)", left, err, w.got())
			continue
		}
		drain(resp)
		if resp.StatusCode != 200 {
			t.Errorf("wait left %v: status %d", left, resp.StatusCode)
		}
	}
	if s := client.node.Stats(); s.ReusedRemote == 0 {
		t.Fatalf("setup: no request went to the owner: %+v", s)
	}
	if s := owner.node.Stats(); s.ServedRemote < 2 {
		t.Errorf("the owner served %d of the sibling's 2 requests (stats %+v)", s.ServedRemote, s)
	}
}
