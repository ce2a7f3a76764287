package proxy

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestAdv67bBusyOwnerRefusalEndsWaitClosesBodies: a streamed POST with
// GetBody goes to a sibling's connection whose owner keeps it waiting for a
// worker and refuses it as busy; the watcher, told of the retry after the
// refusal, ends the wait (as the Caddy module's guard does once the refusal
// spent it). RoundTrip returns the refusal (ErrOwnerBusy, behind the
// context's error) and every body it was given or made is closed.
func TestAdv67bBusyOwnerRefusalEndsWaitClosesBodies(t *testing.T) {
	for _, size := range []int{100, 64 << 10} { // read ahead, and streamed
		u, owner, client := busyOwner(t, 100*time.Millisecond)
		bodies := &adv67Bodies{n: size}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		w := &adv67RefusalEndsWait{cancel: cancel}
		req := bodies.post(WithWaitWatcher(ctx, w), u.url("/cl"))
		req.Header.Set("Idempotency-Key", "adv67b")
		resp, err := client.tr.RoundTrip(req)
		cancel()
		if err == nil {
			drain(resp)
			t.Fatalf("size %d: served after the watcher ended the wait (told %q)", size, w.got())
		}
		if n := owner.node.Stats().RefusedBy["busy"]; n != 1 {
			t.Fatalf("size %d: setup: owner refused %d as busy (err %v, watcher %q)", size, n, err, w.got())
		}
		if !errors.Is(err, ErrOwnerBusy) {
			t.Errorf("size %d: err %v, want the owner's busy refusal behind the context's error", size, err)
		}
		bodies.requireClosed(t, 1, err)
	}
}
