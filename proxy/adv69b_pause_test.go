package proxy

import (
	"context"
	"errors"
	"io"
	"net/http"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/orbitpool"
)

// TestAdv69bPauseCancelled: a capped key's request pausing for room in a
// full table ends soon after its context is cancelled, with the context's
// error, and leaves no goroutine behind.
func TestAdv69bPauseCancelled(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	other, _ := newAdv69bUpstream(t, false, adv69bAnswer(release))
	up, _ := newAdv69bUpstream(t, false, adv69bAnswer(release))
	m := newMember(t, adv69bSpec, func(tr *Transport) { tr.MaxConnsPerKey = 4 })
	adv69bHold(t, m.tr, other.url, 2)
	base := runtime.NumGoroutine()
	for _, after := range []time.Duration{2 * time.Millisecond, 30 * time.Millisecond, 250 * time.Millisecond} {
		ctx, cancel := context.WithCancel(context.Background())
		req, _ := http.NewRequestWithContext(ctx, "GET", up.url+"/x", nil)
		done := make(chan error, 1)
		go func() {
			_, err := m.tr.RoundTrip(req)
			done <- err
		}()
		time.Sleep(after)
		cancel()
		start := time.Now()
		select {
		case err := <-done:
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("cancelled after %v: %v; want context.Canceled", after, err)
			}
			if d := time.Since(start); d > 50*time.Millisecond {
				t.Fatalf("returned %v after the cancel; want it prompt", d)
			}
		case <-time.After(2 * time.Second):
			t.Fatalf("the request cancelled after %v is still pausing 2s later", after)
		}
	}
	waitFor(t, 2*time.Second, "goroutines back to the baseline", func() bool { return runtime.NumGoroutine() <= base })
	if up.accepted() != 0 {
		t.Fatalf("the capped upstream saw %d connections while the table was full", up.accepted())
	}
}

// adv69bPausing is a member whose table is full of another upstream's
// streams, and the URL of a capped upstream.
func adv69bPausing(t *testing.T, release chan struct{}) (*member, string) {
	other, _ := newAdv69bUpstream(t, false, adv69bAnswer(release))
	up, _ := newAdv69bUpstream(t, false, adv69bAnswer(release))
	m := newMember(t, adv69bSpec, func(tr *Transport) { tr.MaxConnsPerKey = 4 })
	adv69bHold(t, m.tr, other.url, 2)
	return m, up.url
}

var adv69bDeadlines = []time.Duration{3 * time.Millisecond, 12 * time.Millisecond, 40 * time.Millisecond, 77 * time.Millisecond, 160 * time.Millisecond}

// TestAdv69bPauseDeadlineError: a capped key's request pausing in a full
// table until its deadline fails with an error wrapping orbitpool.ErrFull
// (what it waited for), neither long before its deadline nor long after
// it, for deadlines that fall at any point of the pause schedule.
func TestAdv69bPauseDeadlineError(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	m, url := adv69bPausing(t, release)
	for _, dl := range adv69bDeadlines {
		for range 8 {
			ctx, cancel := context.WithTimeout(context.Background(), dl)
			req, _ := http.NewRequestWithContext(ctx, "GET", url+"/x", nil)
			start := time.Now()
			_, err := m.tr.RoundTrip(req)
			took := time.Since(start)
			cancel()
			if !errors.Is(err, orbitpool.ErrFull) {
				t.Fatalf("deadline %v: %v after %v; want an error wrapping the table's ErrFull", dl, err, took)
			}
			if took > dl+100*time.Millisecond {
				t.Fatalf("deadline %v: returned after %v", dl, took)
			}
		}
	}
}

// TestAdv69bPauseDeadlineNotResent: the pause's decision that the deadline
// leaves no room for another ask of the pool is final: the request is not
// sent again (it spends none of its MaxRetries, and Stats.Retries does not
// count it), as awayBackoff's same decision ends the request.
func TestAdv69bPauseDeadlineNotResent(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	m, url := adv69bPausing(t, release)
	for _, dl := range adv69bDeadlines {
		r0 := m.node.Stats().Retries
		ctx, cancel := context.WithTimeout(context.Background(), dl)
		req, _ := http.NewRequestWithContext(ctx, "GET", url+"/x", nil)
		_, err := m.tr.RoundTrip(req)
		cancel()
		if r := m.node.Stats().Retries - r0; r != 0 {
			t.Fatalf("deadline %v: the request that paused for room was sent again %d times (err %v); want the pause's end final", dl, r, err)
		}
	}
}

// TestAdv69bPauseSibling: two processes share a segment, each with room
// for one connection. The capped upstream's only connection is the
// sibling's, busy; this process's slot holds a stream to another upstream.
// Its request pauses, then takes the sibling's connection once free: the
// cap (1) is never exceeded and nothing waits forever.
func TestAdv69bPauseSibling(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	rel2 := make(chan struct{})
	rel2Once := sync.OnceFunc(func() { close(rel2) })
	defer rel2Once()
	other, _ := newAdv69bUpstream(t, false, adv69bAnswer(release))
	cu, _ := newAdv69bUpstream(t, false, adv69bAnswer(rel2))
	capped := cu.url
	spec := orbitpool.PoolSpec{Lanes: 2, Keys: 4, ResourcesPerLane: 1, Path: filepath.Join(t.TempDir(), "seg")}
	a := newMember(t, spec, func(tr *Transport) { tr.MaxConnsPerKey = 1 })
	b := newMember(t, spec, func(tr *Transport) { tr.MaxConnsPerKey = 1 })
	// b owns the capped upstream's one connection, busy with a stream.
	req, _ := http.NewRequest("GET", capped+"/stream", nil)
	bresp, err := b.tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	defer bresp.Body.Close()
	// a's one slot holds a stream to another upstream.
	adv69bHold(t, a.tr, other.url, 1)
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", capped+"/conn", nil)
		resp, err := a.tr.RoundTrip(req)
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("the request returned (%v) while the capped upstream's one connection was busy", err)
	case <-time.After(200 * time.Millisecond):
	}
	rel2Once()
	drain(bresp)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("the request that paused: %v", err)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("the request still pausing 3s after the sibling's connection came free")
	}
	if n := cu.accepted(); n != 1 {
		t.Fatalf("the capped upstream (1 connection) saw %d", n)
	}
	if s := a.node.Stats(); s.ReusedRemote != 1 || s.Created != 1 {
		t.Fatalf("a's stats %+v: want the request on the sibling's connection", s)
	}
}
