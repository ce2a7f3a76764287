package proxy

import (
	"context"
	"path/filepath"
	"sync"
	"testing"
	"time"

	countingupstream "github.com/orbitproxy/orbit/integration/upstream"
)

// TestRefusedConnectionWaitsForTheUpstreamsRoom: an upstream that refuses
// connections past its own cap of 2, the fleet's cap the same, answering in
// 1.5s. Both connections' clients give up at once, and four GETs wait for
// their units. The upstream, busy with the abandoned requests, keeps the
// connections past failedWait: they are closed here before it lets them go,
// and their units go back while it still counts them. The waiters' dials
// are refused. Each refused connection's unit stays held while the upstream
// holds connections closed here, and its request, replayable, is sent again
// once there is room: every GET is served, and the upstream refuses no more
// connections than were closed here before it let them go. Before, each
// refusal failed its request and gave its unit straight back to the next
// waiter, refused in turn.
//
// The upstream has shown that it enforces its cap: in a second round, the
// abandoned connections wait for its close, and it refuses none.
func TestRefusedConnectionWaitsForTheUpstreamsRoom(t *testing.T) {
	const limit = 2
	up := startCappedUpstream(t, countingupstream.Options{MaxConns: limit, Delay: 1500 * time.Millisecond})
	spec := testSpec
	spec.Path = filepath.Join(t.TempDir(), "seg")
	m := newMemberOpts(t, spec, NodeOptions{SweepInterval: 50 * time.Millisecond, FailedCloseWait: 300 * time.Millisecond},
		func(tr *Transport) { tr.MaxConnsPerKey = limit })

	abandonWhileWaiting(t, m, m, up, limit)
	st := up.Stats()
	if st.Peak > limit || st.Refused == 0 || st.Refused > limit {
		t.Errorf("the upstream saw %d connections at once and refused %d, cap %d: want one refusal, or one per connection closed before it let go", st.Peak, st.Refused, limit)
	}
	if got := m.node.Stats().UpstreamRefused; got != uint64(st.Refused) {
		t.Errorf("UpstreamRefused = %d, the upstream refused %d", got, st.Refused)
	}

	abandonWhileWaiting(t, m, m, up, limit)
	if again := up.Stats(); again.Refused != st.Refused || again.Peak > limit {
		t.Errorf("second round: the upstream refused %d more connections, saw %d at once, cap %d", again.Refused-st.Refused, again.Peak, limit)
	}
}

// abandonWhileWaiting fills the cap of limit connections to up with
// requests of abandoner's given up after 200ms, while four more of
// waiter's wait for a connection: those four must be served.
func abandonWhileWaiting(t *testing.T, abandoner, waiter *member, up *countingupstream.Server, limit int) {
	t.Helper()
	open := up.Stats().Open
	var wg sync.WaitGroup
	for range limit {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
			if err := getBody(ctx, abandoner.tr, up.URL+"/"); err == nil {
				t.Error("a request given up after 200ms was answered")
			}
		})
	}
	for deadline := time.Now().Add(time.Second); up.Stats().Streams < int64(limit); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the upstream has %d requests in progress (%d connections open before), want %d", up.Stats().Streams, open, limit)
		}
	}
	errs := make(chan error, 4)
	for range cap(errs) {
		wg.Go(func() {
			errs <- getBody(context.Background(), waiter.tr, up.URL+"/")
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("waiting request failed: %v", err)
		}
	}
}

// TestSiblingsRefusalIsKnown: as above, with the connections given up in
// one process and the waiters in another: the sibling whose dial the
// upstream refuses learns, from the fleet's socket directory, of the
// connections the first closed early, holds the refused unit and sends its
// requests again.
func TestSiblingsRefusalIsKnown(t *testing.T) {
	const limit = 2
	up := startCappedUpstream(t, countingupstream.Options{MaxConns: limit, Delay: 1500 * time.Millisecond})
	spec := testSpec
	spec.Path = filepath.Join(t.TempDir(), "seg")
	opts := NodeOptions{SweepInterval: 50 * time.Millisecond, FailedCloseWait: 300 * time.Millisecond}
	conf := func(tr *Transport) { tr.MaxConnsPerKey = limit }
	a := newMemberOpts(t, spec, opts, conf)
	b := newMemberOpts(t, spec, opts, conf)

	abandonWhileWaiting(t, a, b, up, limit)
	st := up.Stats()
	if st.Peak > limit || st.Refused == 0 || st.Refused > limit {
		t.Errorf("the upstream saw %d connections at once and refused %d, cap %d", st.Peak, st.Refused, limit)
	}
	if got := a.node.Stats().UpstreamRefused + b.node.Stats().UpstreamRefused; got != uint64(st.Refused) {
		t.Errorf("UpstreamRefused = %d in all, the upstream refused %d", got, st.Refused)
	}
}
