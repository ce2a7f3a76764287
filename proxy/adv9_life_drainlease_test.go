package proxy

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/orbitpool"
)

// TestAdv9LifeDrainRacesLease: a sibling holds a lease on the owner's one
// idle connection, and as the owner takes the connection up for it (after
// its lookup found the connection, before its take), a drain marks the
// connection dead: CloseIdleConnections, Shutdown, or the sweep finding it
// past its idle timeout; and, as a control, no drain but take itself finding
// it past its idle timeout. In every case the lease must be refused
// retry-safe, the sibling's request must succeed on another connection, the
// drained connection must keep its unit of the key's budget while the
// upstream (silent after our half-close) holds its side open, about
// closeWait, and not a moment less, the refusal must not wait for that, and
// every unit must come back.
func TestAdv9LifeDrainRacesLease(t *testing.T) { testDrainRacesLease(t, false) }

// TestAdv9LifeDrainRacesLocalUse is TestAdv9LifeDrainRacesLease for the
// owner's own request, which takes its idle connection up the same way
// (Shutdown aside: it ends the node the request runs on).
func TestAdv9LifeDrainRacesLocalUse(t *testing.T) { testDrainRacesLease(t, true) }

func testDrainRacesLease(t *testing.T, local bool) {
	drains := []struct {
		name   string
		remote bool                           // only for a sibling's request
		drain  func(owner *member, oc *owned) // runs in the hook, before take
	}{
		{"CloseIdleConnections", false, func(owner *member, oc *owned) { owner.tr.CloseIdleConnections() }},
		{"Shutdown", true, func(owner *member, oc *owned) {
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
				defer cancel()
				owner.node.Shutdown(ctx)
			}()
			// Shutdown marks the idle connection dead at once; then it
			// waits for this very exchange, so it cannot be waited for.
			for deadline := time.Now().Add(3 * time.Second); oc.state.Load() != stDead && time.Now().Before(deadline); {
				time.Sleep(time.Millisecond)
			}
		}},
		{"sweep", false, func(owner *member, oc *owned) {
			oc.idle.Store(sinceStart(time.Now().Add(-2 * time.Minute)))
			owner.node.sweepOnce()
		}},
		{"take finds it expired", false, func(owner *member, oc *owned) {
			oc.idle.Store(sinceStart(time.Now().Add(-2 * time.Minute)))
		}},
	}
	for _, useTLS := range []bool{false, true} {
		for _, d := range drains {
			if local && d.remote {
				continue
			}
			t.Run(fmt.Sprintf("tls=%v/%s", useTLS, d.name), func(t *testing.T) {
				drainRacesLease(t, useTLS, local, d.drain)
			})
		}
	}
}

// drainRacesLease runs a request, the sibling's (or with local the
// owner's own), into a drain of the owner's one idle connection, run by
// drain when the request's take of it begins.
func drainRacesLease(t *testing.T, useTLS, local bool, drain func(owner *member, oc *owned)) {
	u := startRetireUpstream(t, onEOFSilent, useTLS)
	spec := testSpec
	spec.Path = filepath.Join(t.TempDir(), "seg")
	conf := func(tr *Transport) {
		u.conf(tr)
		tr.MaxConnsPerKey = 2
		tr.IdleConnTimeout = time.Minute
	}
	// No background sweep: the drains run where the test puts them.
	opts := NodeOptions{SweepInterval: time.Hour}
	owner := newMemberOpts(t, spec, opts, conf)
	client := newMemberOpts(t, spec, opts, conf)
	url := u.url + "/"
	key := retireKey(t, owner.tr, url)

	if err := getBody(context.Background(), owner.tr, url); err != nil {
		t.Fatalf("warm: %v", err)
	}
	oc := lastOwned(owner)
	if oc == nil || owner.pool.Live(key) != 1 {
		t.Fatalf("warm left no idle connection (live %d)", owner.pool.Live(key))
	}
	id := oc.id

	var once sync.Once
	var drainStart time.Time
	hook := func(c *owned) {
		if c != oc {
			return
		}
		once.Do(func() {
			drainStart = time.Now()
			drain(owner, oc)
		})
	}
	testHookTake.Store(&hook)
	defer testHookTake.Store(nil)

	requester := client
	// When the owner refused the sibling's lease: watched, rather than
	// taken from the request's end, which a loaded machine's dial of the
	// replacement may put late (the request's end, if it came first).
	var refusedAt atomic.Int64
	stopWatch := make(chan struct{})
	watched := make(chan struct{})
	if local {
		requester = owner
		close(watched)
	} else {
		go func() {
			defer close(watched)
			for {
				if owner.node.Stats().RefusedBy["gone"] > 0 {
					refusedAt.Store(time.Now().UnixNano())
					return
				}
				select {
				case <-stopWatch:
					// The request ended, refused before that if at all.
					if owner.node.Stats().RefusedBy["gone"] > 0 {
						refusedAt.Store(time.Now().UnixNano())
					}
					return
				case <-time.After(time.Millisecond):
				}
			}
		}()
	}
	err := getBody(context.Background(), requester.tr, url)
	close(stopWatch)
	<-watched
	if err != nil {
		t.Fatalf("the request failed: %v", err)
	}
	testHookTake.Store(nil)
	if drainStart.IsZero() {
		t.Fatal("the request never reached the owner's take")
	}
	// The refusal must not wait for the drain: the drain's wait for the
	// upstream's close ends closeWait after the drain began, at the
	// earliest. (The owner's own request, refused nothing, is left to the
	// checks below.)
	if at := refusedAt.Load(); !local && at != 0 {
		if d := time.Unix(0, at).Sub(drainStart); d >= closeWait {
			t.Errorf("the owner refused the lease %v after the drain began: the refusal waited on the drain (closeWait %v)", d, closeWait)
		}
	}
	if local {
		if st := owner.node.Stats(); st.Created != 2 {
			t.Errorf("the owner should have gone on to a new connection: %+v", st)
		}
	} else {
		if got := owner.node.Stats().RefusedBy["gone"]; got != 1 {
			t.Errorf("owner refused %d leases as gone, want 1: %+v", got, owner.node.Stats())
		}
		if cs := client.node.Stats(); cs.Retries < 1 || cs.Created != 1 {
			t.Errorf("the sibling should have retried on a connection of its own: %+v", cs)
		}
	}

	// The drained connection's unit: held while the upstream keeps its side
	// open (a second, here), up to closeWait.
	switch held := unitHeld(owner, id, drainStart); {
	case held < 0:
		t.Fatal("the drained connection still holds its unit 3s after the drain")
	case held < closeWait*4/5:
		t.Errorf("the drained connection gave its unit back %v after the drain, before the upstream closed its side (closeWait %v)", held, closeWait)
	}

	requester.tr.CloseIdleConnections()
	if live := settle(3*time.Second, 0, func() int { return client.pool.Live(key) }); live != 0 {
		t.Errorf("%d units of the key still held after every connection left", live)
	}
	snap, err := client.pool.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	for _, ks := range snap.Keys {
		if ks.Key == key && (ks.Live|ks.Creating|ks.InUse|ks.Pending|ks.Busy) != 0 {
			t.Errorf("the key's counts are not back: %+v", ks)
		}
	}
}

// TestAdv9LifeShutdownWhileSweepProbes: Shutdown (or CloseIdleConnections)
// comes while the sweep is probing the owner's idle connection (the sweep's
// own mark, which it turns back to idle once the connection proves fit).
// The connection must still leave, in good order: its unit held until the
// upstream closes its side, up to closeWait, rather than given back at once
// when Close closes what Shutdown left (or never, by CloseIdleConnections).
func TestAdv9LifeShutdownWhileSweepProbes(t *testing.T) {
	t.Run("Shutdown", func(t *testing.T) {
		drainWhileProbing(t, func(n *Node) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			if err := n.Shutdown(ctx); err != nil {
				t.Error(err)
			}
		})
	})
	t.Run("CloseIdleConnections", func(t *testing.T) {
		drainWhileProbing(t, func(n *Node) { (&Transport{Node: n}).CloseIdleConnections() })
	})
}

func drainWhileProbing(t *testing.T, drain func(*Node)) {
	u := startRetireUpstream(t, onEOFSilent, false)
	spec := testSpec
	spec.Path = filepath.Join(t.TempDir(), "seg")
	opts := NodeOptions{SweepInterval: time.Hour}
	owner := newMemberOpts(t, spec, opts, func(tr *Transport) { tr.MaxConnsPerKey = 2 })
	url := u.url + "/"
	if err := getBody(context.Background(), owner.tr, url); err != nil {
		t.Fatalf("warm: %v", err)
	}
	oc := lastOwned(owner)
	if oc == nil || !oc.state.CompareAndSwap(stIdle, stProbing) {
		t.Fatal("warm left no idle connection")
	}
	// The probe ends a moment after Shutdown began, and finds the
	// connection fit, as sweepOnce does.
	probed := make(chan struct{})
	go func() {
		defer close(probed)
		time.Sleep(20 * time.Millisecond)
		oc.state.Store(stIdle)
	}()
	start := time.Now()
	drain(owner.node)
	<-probed
	switch held := unitHeld(owner, oc.id, start); {
	case held < 0:
		t.Fatal("the connection the sweep was probing still holds its unit 3s after the drain began")
	case held < closeWait*4/5:
		t.Errorf("the connection the sweep was probing gave its unit back %v after the drain began, before the upstream closed its side (closeWait %v)", held, closeWait)
	}
}

// TestAdv9LifeShutdownAbandonedLease: a sibling's lease was accepted and
// its connection taken, and Shutdown begins before the owner has read the
// request's head (one larger than maxHeadAhead, which takes the lease up
// before the head's end: see awaitHead), whose end then comes malformed
// (or not at all): the owner
// abandons the lease without using the connection. The connection must
// leave in good order as any other that comes free during a drain (its
// unit held until the upstream closes its side, up to closeWait), rather
// than go back to idle, for Close to close it at once.
func TestAdv9LifeShutdownAbandonedLease(t *testing.T) {
	u := startRetireUpstream(t, onEOFSilent, false)
	spec := testSpec
	spec.Path = filepath.Join(t.TempDir(), "seg")
	opts := NodeOptions{SweepInterval: time.Hour}
	conf := func(tr *Transport) { tr.MaxConnsPerKey = 2 }
	owner := newMemberOpts(t, spec, opts, conf)
	client := newMemberOpts(t, spec, opts, conf)
	if err := getBody(context.Background(), owner.tr, u.url+"/"); err != nil {
		t.Fatalf("warm: %v", err)
	}
	oc := lastOwned(owner)
	if oc == nil {
		t.Fatal("warm left no idle connection")
	}
	frame := leaseFrame(t, client, oc, time.Time{}, 0)
	c, err := net.Dial("unix", SocketPath(SocketDir(spec.Path), owner.pool.Lane()))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	frame = append(frame, "GET / HTTP/1.1\r\nHost: x\r\nX-Pad: "...)
	frame = append(frame, bytes.Repeat([]byte("p"), maxHeadAhead+readBufSize)...)
	if _, err := c.Write(frame); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 3*time.Second, "the owner to take its connection up for the lease", func() bool { return owner.node.Stats().ServedRemote == 1 })
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		done <- owner.node.Shutdown(ctx)
	}()
	waitFor(t, 3*time.Second, "Shutdown to begin", owner.node.draining.Load)
	start := time.Now()
	if _, err := c.Write([]byte("\r\nBOGUS\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	switch held := unitHeld(owner, oc.id, start); {
	case held < 0:
		t.Fatal("the abandoned connection still holds its unit 3s after Shutdown")
	case held < closeWait*4/5:
		t.Errorf("the connection of a lease abandoned during Shutdown gave its unit back %v after, before the upstream closed its side (closeWait %v)", held, closeWait)
	}
}

// unitHeld waits up to 3s for resource id of owner to leave the pool, and
// returns how long after start it left, or -1.
func unitHeld(owner *member, id orbitpool.ResourceID, start time.Time) time.Duration {
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if _, err := owner.pool.Capacity(id); err != nil {
			return time.Since(start)
		}
	}
	return -1
}

// lastOwned is the last connection in owner's slots, nil if none.
func lastOwned(owner *member) *owned {
	var oc *owned
	for i := range owner.node.slots {
		if c := owner.node.slots[i].Load(); c != nil {
			oc = c
		}
	}
	return oc
}

// leaseFrame reserves oc for client and returns the request frame that
// presents the lease, as a sibling sends it before the request head.
func leaseFrame(t *testing.T, client *member, oc *owned, deadline time.Time, flags uint16) []byte {
	t.Helper()
	lease, err := client.pool.Reserve(oc.id)
	if err != nil {
		t.Fatal(err)
	}
	lb, err := lease.AppendBinary(nil)
	if err != nil {
		t.Fatal(err)
	}
	frame, err := appendRequestFrame(nil, lb, deadline, flags)
	if err != nil {
		t.Fatal(err)
	}
	return frame
}
