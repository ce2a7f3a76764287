package proxy

import (
	"context"
	"errors"
	"io"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/orbitpool"
)

// adv69Get runs a GET with a timeout and returns its body.
func adv69Get(tr http.RoundTripper, url string, wait time.Duration) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
	resp, err := tr.RoundTrip(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// TestAdv69SiblingNotBlockedByFullWait: process A's lane is full of its
// capped upstream's long-lived exchanges, and A's request to that upstream
// waits (its limit lowered to the connections the fleet holds). Sibling B,
// whose lane is empty and whose upstream is far below its cap, must still
// dial for its own request at once: A's table being full says nothing
// about B's room.
func TestAdv69SiblingNotBlockedByFullWait(t *testing.T) {
	spec := orbitpool.PoolSpec{Lanes: 2, Keys: 4, ResourcesPerLane: 2, Path: filepath.Join(t.TempDir(), "seg")}
	release, closed := make(chan struct{}), make(chan bool, 16)
	url := unpooledUpstream(t, release, closed)
	capped := func(tr *Transport) { tr.MaxConnsPerKey = 8 }
	a := newMember(t, spec, capped)
	b := newMember(t, spec, capped)
	held := holdStreams(t, a, url, 2)

	type result struct {
		body string
		err  error
	}
	waiting := make(chan result, 1)
	go func() {
		body, err := adv69Get(a.tr, url+"/once", 3*time.Second)
		waiting <- result{body, err}
	}()
	time.Sleep(300 * time.Millisecond) // A's request is parked on the key

	start := time.Now()
	body, err := adv69Get(b.tr, url+"/once", 2*time.Second)
	took := time.Since(start)

	close(release)
	for _, r := range held {
		drain(r)
	}
	r := <-waiting
	if err != nil || body != "ok" || took > time.Second {
		t.Fatalf("B's request (empty lane, 2 of 8 connections in the fleet) while A waits on a full table: %q, %v after %v; want it served at once (A's wait: %q, %v)", body, err, took, r.body, r.err)
	}
}

// TestAdv69SiblingServedAfterFullWaitEnds: as above, but A's request gives
// up first. Once nothing older waits on the key, B's request (which could
// dial all along) must be served, not left parked until its own deadline.
func TestAdv69SiblingServedAfterFullWaitEnds(t *testing.T) {
	spec := orbitpool.PoolSpec{Lanes: 2, Keys: 4, ResourcesPerLane: 2, Path: filepath.Join(t.TempDir(), "seg")}
	release, closed := make(chan struct{}), make(chan bool, 16)
	defer close(release)
	url := unpooledUpstream(t, release, closed)
	capped := func(tr *Transport) { tr.MaxConnsPerKey = 8 }
	a := newMember(t, spec, capped)
	b := newMember(t, spec, capped)
	holdStreams(t, a, url, 2)

	aerr := make(chan error, 1)
	go func() {
		_, err := adv69Get(a.tr, url+"/once", 600*time.Millisecond)
		aerr <- err
	}()
	time.Sleep(300 * time.Millisecond)
	start := time.Now()
	body, err := adv69Get(b.tr, url+"/once", 3*time.Second)
	took := time.Since(start)
	ea := <-aerr
	if ea == nil {
		t.Fatalf("A's request was served with its table full and its connections held")
	}
	if err != nil || body != "ok" || took > 1500*time.Millisecond {
		t.Fatalf("B's request after A's wait ended (at about 300ms): %q, %v after %v; want it served soon after", body, err, took)
	}
}

// TestAdv69ConcurrentFullWaitsSameError: two requests to a capped upstream
// find the table full at the same time and wait until their deadline: both
// were refused for the same reason (the table had no room, and none of the
// upstream's connections freed), and both must say so (orbitpool.ErrFull,
// which caddymodule maps to 503 table_full), not only the first to arrive.
func TestAdv69ConcurrentFullWaitsSameError(t *testing.T) {
	spec := orbitpool.PoolSpec{Lanes: 1, Keys: 4, ResourcesPerLane: 2}
	release, closed := make(chan struct{}), make(chan bool, 16)
	defer close(release)
	url := unpooledUpstream(t, release, closed)
	m := newMember(t, spec, func(tr *Transport) { tr.MaxConnsPerKey = 8 })
	holdStreams(t, m, url, 2)
	errs := make(chan error, 2)
	for range 2 {
		go func() {
			_, err := adv69Get(m.tr, url+"/once", 400*time.Millisecond)
			errs <- err
		}()
	}
	for range 2 {
		if err := <-errs; !errors.Is(err, orbitpool.ErrFull) {
			t.Errorf("a capped request that waited on a full table: %v; want the table's error", err)
		}
	}
}
