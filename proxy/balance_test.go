package proxy

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	countingupstream "github.com/orbitproxy/orbit/integration/upstream"
	"github.com/orbitproxy/orbit/internal/grpcmsg"
	"github.com/orbitproxy/orbit/orbitpool"
)

// windowFleet is newFleet with the pools' order window at window.
func windowFleet(t testing.TB, n int, window uint32, conf func(*Transport)) []*member {
	t.Helper()
	spec := testSpec
	spec.Path = filepath.Join(t.TempDir(), "seg")
	var ms []*member
	for range n {
		ms = append(ms, newMemberPoolOpts(t, spec, orbitpool.Options{ReconcileInterval: 50 * time.Millisecond, OrderWindow: window},
			NodeOptions{SweepInterval: 50 * time.Millisecond}, conf))
	}
	return ms
}

// holdDials sets, for the rest of t, how long dials are held back for a
// sibling: cold until a hold has been in vain, warm after.
func holdDials(t testing.TB, warm, cold time.Duration) {
	d, c := dialHold, coldDialHold
	t.Cleanup(func() { dialHold, coldDialHold = d, c })
	dialHold, coldDialHold = warm, cold
}

// steadyLoad runs, for each member i, goroutines[i] closed-loop goroutines
// sending GETs until total requests have been sent fleet-wide, and returns
// how many failed.
func steadyLoad(ms []*member, goroutines []int, url string, total int64) int64 {
	var sent, errs atomic.Int64
	var wg sync.WaitGroup
	for i, m := range ms {
		for range goroutines[i] {
			wg.Go(func() {
				for sent.Add(1) <= total {
					if err := getBody(context.Background(), m.tr, url); err != nil {
						errs.Add(1)
					}
				}
			})
		}
	}
	wg.Wait()
	return errs.Load()
}

// ownership returns the connections the members moved and created, and
// each one's open connections.
func ownership(ms []*member) (moved, created uint64, owned []int) {
	for _, m := range ms {
		st := m.node.Stats()
		moved += st.Rebalanced
		created += st.Created
		owned = append(owned, st.OpenConns)
	}
	return moved, created, owned
}

// TestOwnershipEvensOut: one process dialed all four of a capped key's
// connections, and then only its sibling has requests. Its connections
// leave one at a time, in good order, and the sibling dials each
// replacement, until the two hold two each: then neither holds two more
// than the other, and nothing moves again. No request fails, and the
// upstream, which enforces the same cap, refuses nothing and never sees
// more than it. In strict order (a window of 0) nothing moves.
func TestOwnershipEvensOut(t *testing.T) {
	const limit = 4
	for _, tc := range []struct {
		window uint32
		moves  uint64
		owned  []int
	}{
		{16, 2, []int{2, 2}},
		{0, 0, []int{limit, 0}},
	} {
		up := startCappedUpstream(t, countingupstream.Options{MaxConns: limit, Delay: time.Millisecond})
		ms := windowFleet(t, 2, tc.window, func(tr *Transport) { tr.MaxConnsPerKey = limit })
		errs := steadyLoad(ms, []int{2 * limit, 0}, up.URL+"/", 50*limit)
		if _, _, owned := ownership(ms); owned[0] != limit {
			t.Fatalf("window %d: the first process holds %v connections after its load, want the cap, %d", tc.window, owned, limit)
		}
		errs += steadyLoad(ms, []int{0, 2 * limit}, up.URL+"/", 8*balanceEvery)
		moved, created, owned := ownership(ms)
		if moved != tc.moves || created != limit+tc.moves || owned[0] != tc.owned[0] || owned[1] != tc.owned[1] {
			t.Errorf("window %d: %d moves, %d connections created, held %v; want %d moves and %v",
				tc.window, moved, created, owned, tc.moves, tc.owned)
		}
		if st := up.Stats(); errs != 0 || st.Refused != 0 || st.Peak > limit {
			t.Errorf("window %d: %d requests failed; the upstream refused %d connections and saw %d at once, with the fleet's cap at its own %d",
				tc.window, errs, st.Refused, st.Peak, limit)
		}
	}
}

// TestOwnershipSettles: members with steady demand on a capped key, equal
// or not, over a cap that does not divide evenly among them. Ownership may
// move early, but each move lowers the sum of the squares of the counts, so
// the moves are few and stop: none in the second half of the run. Each
// would cost the upstream a new connection.
func TestOwnershipSettles(t *testing.T) {
	for _, tc := range []struct {
		name  string
		limit int
		load  []int // goroutines per member
	}{
		{"cap 4 over 3", 4, []int{3, 3, 3}},
		{"cap 6 over 4", 6, []int{3, 3, 3, 3}},
		{"cap 6 over 5:3:2", 6, []int{5, 3, 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := startCappedUpstream(t, countingupstream.Options{MaxConns: tc.limit, Delay: 500 * time.Microsecond})
			ms := windowFleet(t, len(tc.load), 16, func(tr *Transport) { tr.MaxConnsPerKey = tc.limit })
			const phases, perPhase = 6, 1500
			var errs int64
			var late uint64
			for p := range phases {
				before, _, _ := ownership(ms)
				errs += steadyLoad(ms, tc.load, up.URL+"/", perPhase)
				moved, _, _ := ownership(ms)
				if p >= phases/2 {
					late += moved - before
				}
			}
			moved, created, owned := ownership(ms)
			st := up.Stats()
			if late != 0 || moved > uint64(tc.limit*tc.limit/2) {
				t.Errorf("%d moves in all, %d in the second half; held %v, %d connections created for %d requests",
					moved, late, owned, created, phases*perPhase)
			}
			if errs != 0 || st.Refused != 0 || st.Peak > int64(tc.limit) {
				t.Errorf("%d requests failed; the upstream refused %d and saw %d at once (cap %d)", errs, st.Refused, st.Peak, tc.limit)
			}
		})
	}
}

// TestMovesKeepTheCapTLS: one process dials all of a capped key's TLS
// connections, then it and two siblings share the load, so that
// connections move, also while they leave by their request limit, with an
// upstream whose own cap is the fleet's: no request fails, and the upstream
// refuses nothing and never sees more than the cap.
func TestMovesKeepTheCapTLS(t *testing.T) {
	for _, reqs := range []int{0, 5} {
		const limit = 4
		up := startCappedUpstream(t, countingupstream.Options{MaxConns: limit, TLS: true, Delay: 500 * time.Microsecond})
		ms := windowFleet(t, 3, 16, func(tr *Transport) {
			tr.MaxConnsPerKey = limit
			tr.MaxRequestsPerConn = reqs
			tr.TLSClientConfig = &tls.Config{RootCAs: up.CertPool}
		})
		errs := steadyLoad(ms, []int{2 * limit, 0, 0}, up.URL+"/", 50*limit)
		errs += steadyLoad(ms, []int{2, 3, 3}, up.URL+"/", 3000)
		st := up.Stats()
		if errs != 0 || st.Refused != 0 || st.Peak > limit {
			t.Errorf("request limit %d: %d requests failed; the upstream refused %d and saw %d at once (cap %d)", reqs, errs, st.Refused, st.Peak, limit)
		}
		if moved, _, owned := ownership(ms); reqs == 0 && moved == 0 {
			t.Errorf("the first process dialed all %d connections and its siblings wait, yet nothing moved: held %v", limit, owned)
		}
	}
}

// TestMoveOfAGoneConnectionEnds: a move whose connection has already left
// the process's slots (another path retired it first) ends at once, so the
// key's connections can move again.
func TestMoveOfAGoneConnectionEnds(t *testing.T) {
	m := windowFleet(t, 1, 16, nil)[0]
	key := orbitpool.Key{Hi: 1, Lo: 2}
	m.node.setCap(key, 4, "")
	b := m.node.capOf(key)
	b.moving.Store(true)
	a, c := net.Pipe()
	defer c.Close()
	m.node.retireToward(&owned{key: key, c: newConn(a, a)}, nil, 1, nil)
	if b.moving.Load() || b.off.Load() {
		t.Errorf("after the move of a connection no longer in the slots: moving %v, off %v; want neither", b.moving.Load(), b.off.Load())
	}
}

// TestFixedOwnershipMovesNothing: as TestOwnershipEvensOut, with
// NodeOptions.FixedOwnership: the process that dialed all four connections
// keeps them, and its sibling borrows them.
func TestFixedOwnershipMovesNothing(t *testing.T) {
	const limit = 4
	up := startCappedUpstream(t, countingupstream.Options{MaxConns: limit, Delay: time.Millisecond})
	spec := testSpec
	spec.Path = filepath.Join(t.TempDir(), "seg")
	var ms []*member
	for range 2 {
		ms = append(ms, newMemberPoolOpts(t, spec, orbitpool.Options{ReconcileInterval: 50 * time.Millisecond, OrderWindow: 16},
			NodeOptions{SweepInterval: 50 * time.Millisecond, FixedOwnership: true}, func(tr *Transport) { tr.MaxConnsPerKey = limit }))
	}
	errs := steadyLoad(ms, []int{2 * limit, 0}, up.URL+"/", 50*limit)
	errs += steadyLoad(ms, []int{0, 2 * limit}, up.URL+"/", 8*balanceEvery)
	if moved, created, owned := ownership(ms); moved != 0 || created != limit || owned[0] != limit {
		t.Errorf("with fixed ownership: %d moves, %d connections created, held %v; want none, %d and [%d 0]", moved, created, owned, limit, limit)
	}
	if errs != 0 {
		t.Errorf("%d requests failed", errs)
	}
}

// TestDialGoesToTheNeediest: a capped key's connection closes while both
// processes wait for one, the first holding the other connection and the
// second none. The unit goes to the first process's older waiter, which
// leaves the dial to its sibling rather than come to hold both connections
// (a move would then cost the upstream one more): the sibling dials, and
// every request is answered. In strict order (a window of 0) nothing is
// passed on.
func TestDialGoesToTheNeediest(t *testing.T) {
	for _, tc := range []struct {
		window  uint32
		created [2]uint64
		passed  uint64
	}{
		{16, [2]uint64{2, 1}, 1},
		{0, [2]uint64{3, 0}, 0},
	} {
		const limit = 2
		var inFlight atomic.Int64
		release := map[string]chan struct{}{"/close": make(chan struct{}), "/hold": make(chan struct{})}
		free := map[string]func(){}
		for path, ch := range release {
			free[path] = sync.OnceFunc(func() { close(ch) })
			defer free[path]()
		}
		up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			inFlight.Add(1)
			defer inFlight.Add(-1)
			if ch := release[r.URL.Path]; ch != nil {
				<-ch
			}
			if r.URL.Path == "/close" {
				w.Header().Set("Connection", "close")
			}
		}))
		t.Cleanup(up.Close)
		ms := windowFleet(t, 2, tc.window, func(tr *Transport) { tr.MaxConnsPerKey = limit })
		waiting := func(n int) {
			t.Helper()
			for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
				got := waitingIn(t, ms[0])
				if got == n && int(inFlight.Load()) == limit {
					return
				}
				if time.Now().After(deadline) {
					t.Fatalf("window %d: %d requests wait and %d are at the upstream; want %d and %d", tc.window, got, inFlight.Load(), n, limit)
				}
			}
		}
		var wg sync.WaitGroup
		errs := make(chan error, 4)
		get := func(m *member, path string) {
			wg.Go(func() {
				if err := getBody(context.Background(), m.tr, up.URL+path); err != nil {
					errs <- fmt.Errorf("%s: %w", path, err)
				}
			})
		}
		get(ms[0], "/close")
		get(ms[0], "/hold")
		waiting(0)
		get(ms[0], "/")
		waiting(1)
		get(ms[1], "/")
		waiting(2)
		free["/close"]()
		// The connection that closed is dialed again before the one held
		// is free. Within the window, the second process's request runs
		// on the connection it dials, and the first's, which passed that
		// dial on, waits for a free one.
		for deadline := time.Now().Add(5 * time.Second); ms[0].node.Stats().Created+ms[1].node.Stats().Created < limit+1; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("window %d: the connection that closed was not dialed again", tc.window)
			}
		}
		free["/hold"]()
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Errorf("window %d: %v", tc.window, err)
		}
		a, b := ms[0].node.Stats(), ms[1].node.Stats()
		if a.Created != tc.created[0] || b.Created != tc.created[1] || a.DialsPassed != tc.passed {
			t.Errorf("window %d: the processes dialed %d and %d connections, the first passing %d dials on; want %v and %d",
				tc.window, a.Created, b.Created, a.DialsPassed, tc.created, tc.passed)
		}
	}
}

// TestColdStartDialsGoToSiblings: one process's requests for a capped key
// come first and take the whole creation budget; its siblings' come a moment
// later. It dials its share of the cap, and passes each other dial it took
// to a sibling that waits while holding fewer, so that the fleet dials the
// cap and seldom more. Before, the first process dialed the whole cap and
// then moved three connections in four, each move a connection more for the
// upstream. Which request takes which unit varies, and a unit passed on may
// come back unused, so each cold start may still need a move or two: the
// test adds up several.
func TestColdStartDialsGoToSiblings(t *testing.T) {
	const limit, members, starts = 8, 4, 5
	// A hold must not end before the siblings wait, however slow the
	// machine.
	holdDials(t, 5*time.Second, 5*time.Second)
	var firstDialed, allMoved uint64
	for range starts {
		up := startCappedUpstream(t, countingupstream.Options{MaxConns: limit, Delay: 2 * time.Millisecond})
		ms := windowFleet(t, members, 64, func(tr *Transport) { tr.MaxConnsPerKey = limit })
		var errs atomic.Int64
		var wg sync.WaitGroup
		load := func(m *member) {
			for range limit {
				wg.Go(func() {
					for range 25 {
						if err := getBody(context.Background(), m.tr, up.URL+"/"); err != nil {
							errs.Add(1)
						}
					}
				})
			}
		}
		load(ms[0])
		for deadline := time.Now().Add(5 * time.Second); ms[0].node.Stats().DialsHeld == 0; time.Sleep(100 * time.Microsecond) {
			if time.Now().After(deadline) {
				t.Fatalf("the first process held back no dial; it dialed %d", ms[0].node.Stats().Created)
			}
		}
		for _, m := range ms[1:] {
			load(m)
		}
		wg.Wait()
		moved, created, owned := ownership(ms)
		if created-moved != limit {
			t.Errorf("%d connections created, %d of them replacing moves; held %v: want the cap, %d, besides moves", created, moved, owned, limit)
		}
		if st := up.Stats(); errs.Load() != 0 || st.Refused != 0 || st.Peak > limit {
			t.Errorf("%d requests failed; the upstream refused %d connections and saw %d at once (cap %d)", errs.Load(), st.Refused, st.Peak, limit)
		}
		firstDialed += ms[0].node.Stats().Created
		allMoved += moved
	}
	// Without the hold: 8 and 6 moves each time.
	if firstDialed > starts*(limit/members+2) || allMoved > 2*starts {
		t.Errorf("over %d cold starts the first process dialed %d connections and the fleet moved %d; want at most %d and %d (its share is %d)",
			starts, firstDialed, allMoved, starts*(limit/members+2), 2*starts, limit/members)
	}
}

// TestDialHoldEndsAlone: a process past its share of a capped key whose
// siblings want none of it holds its dials back for dialHold only, then dials
// them itself; and for dialHoldPause after that, it holds none back: uneven
// demand pays the hold once a pause.
func TestDialHoldEndsAlone(t *testing.T) {
	const limit = 4
	holdDials(t, 50*time.Millisecond, 50*time.Millisecond)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(10 * time.Millisecond) // long enough that a burst's requests overlap on a loaded machine
		if r.URL.Path == "/close" {
			w.Header().Set("Connection", "close")
		}
	}))
	t.Cleanup(up.Close)
	ms := windowFleet(t, 2, 64, func(tr *Transport) { tr.MaxConnsPerKey = limit })
	burst := func(path string) time.Duration {
		var slowest atomic.Int64
		var wg sync.WaitGroup
		for range 2 * limit {
			wg.Go(func() {
				start := time.Now()
				if err := getBody(context.Background(), ms[0].tr, up.URL+path); err != nil {
					t.Errorf("%s: %v", path, err)
				}
				d := int64(time.Since(start))
				for s := slowest.Load(); d > s && !slowest.CompareAndSwap(s, d); s = slowest.Load() {
				}
			})
		}
		wg.Wait()
		return time.Duration(slowest.Load())
	}
	if slowest := burst("/"); slowest < dialHold {
		t.Errorf("the slowest request of the first burst took %s; a dial past the process's share waits %s first", slowest, dialHold)
	}
	st := ms[0].node.Stats()
	if st.Created != limit || st.DialsHeld < 1 || st.DialsHeld > limit/2 || st.DialsPassed != 0 {
		t.Fatalf("the process dialed %d connections, held %d dials back and passed %d on; want the cap, %d, 1 or 2 held back (past its share of 2), none passed",
			st.Created, st.DialsHeld, st.DialsPassed, limit)
	}
	// Every connection closes after its next request, and the burst after
	// dials them again, within the pause: none held back.
	burst("/close")
	burst("/")
	if after := ms[0].node.Stats(); after.DialsHeld != st.DialsHeld || after.Created <= st.Created {
		t.Errorf("after its connections closed, the process dialed %d more and held %d dials back; want more dialed and none held back within %s of a hold in vain",
			after.Created-st.Created, after.DialsHeld-st.DialsHeld, dialHoldPause)
	}
}

// oneCappedConn starts a fleet of two processes whose key to a new upstream
// is capped at limit, and returns the first process's node, holding one
// connection of the key, with the key and its record.
func oneCappedConn(t *testing.T, limit int) (*Node, orbitpool.Key, *keyCap) {
	t.Helper()
	up := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	t.Cleanup(up.Close)
	ms := windowFleet(t, 2, 64, func(tr *Transport) { tr.MaxConnsPerKey = limit })
	if err := getBody(context.Background(), ms[0].tr, up.URL); err != nil {
		t.Fatal(err)
	}
	key := mustKey(t, ms[0].tr, up.URL)
	kc := ms[0].node.capOf(key)
	if kc == nil {
		t.Fatal("no record of the key's cap")
	}
	return ms[0].node, key, kc
}

// TestDialHoldEndsBelowTheShare: a hold ends as soon as its process is no
// longer past its share (here a dial of its own ended), and dials at once;
// that early end was not a hold in vain, so the next dial past the share
// holds again, for the cold start's longer hold, and only a hold that ran
// its course pauses the holds. After that pause, holds are short.
func TestDialHoldEndsBelowTheShare(t *testing.T) {
	n, key, kc := oneCappedConn(t, 4)
	// One connection and one dial of its own: the process is at its
	// share, 2 of the cap of 4 over two processes.
	kc.dialing.Add(1)
	holdDials(t, time.Minute, time.Minute)
	ended := make(chan int, 1)
	begin := time.Now()
	go func() { ended <- n.dialToward(context.Background(), kc, key, true) }()
	for n.Stats().DialsHeld == 0 {
		if time.Since(begin) > 10*time.Second {
			t.Fatal("no hold began in 10s")
		}
		time.Sleep(time.Millisecond)
	}
	select {
	case lane := <-ended:
		t.Fatalf("the hold ended (lane %d) while the process was still at its share", lane)
	case <-time.After(20 * time.Millisecond):
	}
	kc.dialEnds() // the dial of its own ended: below its share now
	select {
	case lane := <-ended:
		if lane != -1 {
			t.Fatalf("the hold passed its dial to lane %d; no sibling waits", lane)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the hold went on 10s after its process fell below its share")
	}
	if d := kc.dialing.Load(); d != 1 {
		t.Fatalf("%d dials counted after the early end; want the one it chose to make", d)
	}
	if pause := kc.noHoldUntil.Load(); pause > sinceStart(time.Now()) {
		t.Fatal("an early end paused the holds, as if the hold had been in vain")
	}

	// Past the share again (a connection and a dial): the next dial holds,
	// for coldDialHold since no hold has been in vain yet, and that hold
	// in vain pauses the holds.
	holdDials(t, 20*time.Millisecond, 60*time.Millisecond)
	begin = time.Now()
	if lane := n.dialToward(context.Background(), kc, key, true); lane != -1 {
		t.Fatalf("the hold passed its dial to lane %d; no sibling waits", lane)
	}
	if d := time.Since(begin); d < coldDialHold {
		t.Errorf("the second dial past the share went after %v, without the cold start's hold of %v", d, coldDialHold)
	}
	if pause := kc.noHoldUntil.Load(); pause <= sinceStart(time.Now()) {
		t.Error("a hold in vain did not pause the holds")
	}

	// Once the pause is over, a hold lasts dialHold: the cold start ended
	// with the first hold in vain.
	kc.noHoldUntil.Store(sinceStart(time.Now()))
	holdDials(t, 20*time.Millisecond, time.Minute)
	begin = time.Now()
	if lane := n.dialToward(context.Background(), kc, key, true); lane != -1 {
		t.Fatalf("the hold passed its dial to lane %d; no sibling waits", lane)
	}
	if d := time.Since(begin); d < dialHold || d > 10*time.Second {
		t.Errorf("the third dial past the share went after %v; want its hold of %v, the cold start over", d, dialHold)
	}
	if st := n.Stats(); st.DialsHeld != 3 {
		t.Errorf("%d dials held back; want 3", st.DialsHeld)
	}
	for range 3 {
		kc.dialEnds()
	}
}

// TestDialHoldLeavesTimeToDial: a request with a deadline holds its dial
// back for half of the time it has left at most, however long holds last,
// so that it can still dial and be served.
func TestDialHoldLeavesTimeToDial(t *testing.T) {
	n, key, kc := oneCappedConn(t, 4)
	kc.dialing.Add(1) // at its share: the next dial holds
	holdDials(t, time.Minute, time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
	defer cancel()
	begin := time.Now()
	if lane := n.dialToward(ctx, kc, key, true); lane != -1 {
		t.Fatalf("the hold passed its dial to lane %d; no sibling waits", lane)
	}
	if d := time.Since(begin); ctx.Err() != nil || d > 3*time.Second {
		t.Errorf("the hold ended after %v (context: %v); want about half of the request's 4s", d, ctx.Err())
	}
	if st := n.Stats(); st.DialsHeld != 1 {
		t.Errorf("%d dials held back; want 1", st.DialsHeld)
	}
	kc.dialEnds()
	kc.dialEnds()
}

// TestDialRegistersInOneStep: a connection being registered counts once
// among its process's connections of a capped key, for a decision made
// meanwhile. Registering it and ending its dial's count were two steps, and
// a decision between them counted it twice: in a burst of TestDialHoldEndsAlone
// (1 run in 200 under load), three requests held their dials back where the
// process had room for one more dial of its share.
func TestDialRegistersInOneStep(t *testing.T) {
	// A cap of 6 over two processes: the share is 3.
	n, key, kc := oneCappedConn(t, 6)
	// One connection and a second being dialed: below the share, and
	// still below it once the dial's connection is in the pool.
	kc.dialBegins()
	permit, err := n.pool.ClaimCreate(key, orbitpool.Limits{MaxResources: 6})
	if err != nil {
		t.Fatal(err)
	}
	type decision struct {
		lane    int
		holding bool
	}
	decided := make(chan decision, 1)
	exec, err := kc.register(permit, 1, func() {
		// Registered, its dial not yet ended: a decision now must wait
		// for the end, or it sees 3 of the process's connections.
		go func() {
			lane, holding := n.passOrDial(kc, key, true, true)
			decided <- decision{lane, holding}
		}()
		select {
		case d := <-decided:
			decided <- d
		case <-time.After(100 * time.Millisecond):
		}
		kc.dialEnds()
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		n.pool.Unregister(exec.ID())
		exec.Complete()
	})
	d := <-decided
	if d.lane != -1 || d.holding {
		t.Fatalf("a decision made while a dial registered passed to lane %d, held back %v; want a dial here: 2 connections of a share of 3", d.lane, d.holding)
	}
	kc.dialEnds() // the decision's dial
	if c := kc.dialing.Load(); c != 0 {
		t.Fatalf("%d dials still counted", c)
	}
}

// TestDialCountsEnd: a capped key's dials count among its process's
// connections from the choice to dial until the pool holds the connection,
// or the dial fails (see dialToward). After requests over HTTP/1.1 and
// HTTP/2, and a dial the upstream refuses, none is left counted: a count
// left behind would make the process hold dials back and pass them on as
// if it held more than it does.
func TestDialCountsEnd(t *testing.T) {
	h1 := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	t.Cleanup(h1.Close)
	h2 := newH2Upstream(t, 100)
	gone := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	gone.Close()
	for _, tc := range []struct {
		name, url string
		h2c, fail bool
	}{
		{"HTTP/1.1", h1.URL + "/", false, false},
		{"HTTP/2", h2.url + "/unary", true, false},
		{"refused", gone.URL + "/", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ms := windowFleet(t, 2, 16, func(tr *Transport) {
				tr.MaxConnsPerKey = 4
				tr.H2C = tc.h2c
			})
			var wg sync.WaitGroup
			for range 8 {
				wg.Go(func() {
					var err error
					if tc.h2c {
						var resp *http.Response
						req := grpcReq(t, context.Background(), tc.url, bytes.NewReader(grpcmsg.Frame([]byte("hello"))))
						if resp, err = ms[0].tr.RoundTrip(req); err == nil {
							_, err = grpcmsg.Read(resp.Body)
							resp.Body.Close()
						}
					} else {
						err = getBody(context.Background(), ms[0].tr, tc.url)
					}
					if (err != nil) != tc.fail {
						t.Errorf("request: %v", err)
					}
				})
			}
			wg.Wait()
			kc := ms[0].node.capOf(mustKey(t, ms[0].tr, tc.url))
			if kc == nil {
				t.Fatal("no record of the key's cap")
			}
			if n := kc.dialing.Load(); n != 0 {
				t.Errorf("%d dials still counted once every request has ended (%d connections created)", n, ms[0].node.Stats().Created)
			}
		})
	}
}

// TestIdleBeforeReuseTimesEachTake: every take of an idle connection adds
// the time since its last exchange ended to IdleBeforeReuse.
func TestIdleBeforeReuseTimesEachTake(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	t.Cleanup(up.Close)
	ms := windowFleet(t, 1, 0, nil)
	const gap = 30 * time.Millisecond
	for i := range 3 {
		if i > 0 {
			time.Sleep(gap)
		}
		if err := getBody(context.Background(), ms[0].tr, up.URL); err != nil {
			t.Fatal(err)
		}
	}
	st := ms[0].node.Stats()
	if st.Created != 1 || st.IdleReuses != 2 {
		t.Fatalf("%d connections created, %d idle takes timed; want 1 and 2", st.Created, st.IdleReuses)
	}
	if st.IdleBeforeReuse < 2*gap || st.IdleBeforeReuse > 2*gap+5*time.Second {
		t.Errorf("idle before reuse %v over 2 takes %v apart", st.IdleBeforeReuse, gap)
	}
}

// busyFleet starts a fleet of len(busy) processes whose key to a new
// upstream is capped at limit, process i holding busy[i] connections of it
// with requests the upstream answers only at the test's end, and returns the
// fleet, the key, and get, which sends a request from a process and waits
// until it is held or the request fails; the test fails if any did.
func busyFleet(t *testing.T, limit int, busy []int) ([]*member, orbitpool.Key, func(m *member, path string)) {
	t.Helper()
	var inFlight atomic.Int64
	hold := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		inFlight.Add(1)
		defer inFlight.Add(-1)
		if r.URL.Path == "/hold" {
			<-hold
		}
	}))
	ms := windowFleet(t, len(busy), 64, func(tr *Transport) { tr.MaxConnsPerKey = limit })
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	get := func(m *member, path string) {
		wg.Go(func() {
			if err := getBody(context.Background(), m.tr, up.URL+path); err != nil {
				errs <- fmt.Errorf("%s: %w", path, err)
			}
		})
	}
	// Registered after the fleet's own cleanups, so run before them.
	t.Cleanup(func() {
		close(hold)
		wg.Wait()
		up.Close()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
	})
	total := 0
	for i, n := range busy {
		for range n {
			get(ms[i], "/hold")
		}
		total += n
	}
	waitFor(t, 10*time.Second, "the busy connections at the upstream", func() bool { return inFlight.Load() == int64(total) })
	return ms, mustKey(t, ms[0].tr, up.URL), get
}

// waitingIn is how many requests wait in the fleet, as m's pool sees it.
func waitingIn(t *testing.T, m *member) int {
	t.Helper()
	return sumKeys(t, m.pool, func(k orbitpool.KeyStats) int { return k.Waiting })
}

// sumKeys sums f over the keys of p's snapshot.
func sumKeys(t *testing.T, p *orbitpool.Pool, f func(orbitpool.KeyStats) int) int {
	t.Helper()
	snap, err := p.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, k := range snap.Keys {
		n += f(k)
	}
	return n
}

// siblingWaits has the second process of a busyFleet, whose cap is all in
// use, send a request, waits until it waits, and gives the first process's
// record (kc) the passes p to it, made now.
func siblingWaits(t *testing.T, ms []*member, get func(*member, string), kc *keyCap, p passedDials) {
	t.Helper()
	get(ms[1], "/")
	waitFor(t, 10*time.Second, "the sibling's request waiting", func() bool { return waitingIn(t, ms[0]) == 1 })
	p.at = sinceStart(time.Now())
	kc.passMu.Lock()
	kc.passed = map[int]passedDials{ms[1].pool.Lane(): p}
	kc.passMu.Unlock()
}

// TestPassesOnRecordAreUnitsOut: the passes a process's record counts for a
// sibling are bounded by the units of the cap outside live connections. Here
// every unit is in a connection but the one the deciding request holds, so
// the pass on record to the waiting sibling cannot be on its way (the
// sibling's request found room, or passed it on): the request passes its
// unit to that sibling, rather than dialing as if the sibling held as many
// connections as its process. In a cold start, a record that counted such
// passes had the first process dial past its share, and the balancer move
// three connections.
func TestPassesOnRecordAreUnitsOut(t *testing.T) {
	const limit = 4 // over two processes: a share of 2
	ms, key, get := busyFleet(t, limit, []int{2, 1})
	n := ms[0].node
	kc := n.capOf(key)
	// The last unit of the cap: the second process's next request waits.
	permit, err := n.pool.ClaimCreate(key, orbitpool.Limits{MaxResources: limit})
	if err != nil {
		t.Fatal(err)
	}
	siblingWaits(t, ms, get, kc, passedDials{base: 1, n: 1})
	// The sibling holds 1; the record's pass to it is not on its way.
	passesTo(t, ms, kc, key, true, permit, passedDials{base: 1, n: 2}, 2)
	if a := n.Stats().Created; a != 2 {
		t.Errorf("the first process dialed %d connections; want its share, 2", a)
	}
}

// TestFailedPassIsPassedAgain: a request that passed its dial on before gets
// a unit; the record counts two passes to the waiting sibling, and two units
// are on their way (being dialed by that sibling). The request takes one of
// the passes for its own unit come back unused, so the sibling holds one
// fewer than the record says, and passes the unit to it again rather than
// dialing past its process's share; the record then counts two passes, not
// three. A request that passed nothing before has no such evidence, and
// dials.
func TestFailedPassIsPassedAgain(t *testing.T) {
	const limit = 5 // over three processes: a share of 2
	ms, key, get := busyFleet(t, limit, []int{2, 0, 0})
	n := ms[0].node
	kc := n.capOf(key)
	permit, err := n.pool.ClaimCreate(key, orbitpool.Limits{MaxResources: limit})
	if err != nil {
		t.Fatal(err)
	}
	// The sibling's two dials under way, the units on their way.
	for range 2 {
		p, err := ms[1].pool.ClaimCreate(key, orbitpool.Limits{MaxResources: limit})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
	}
	siblingWaits(t, ms, get, kc, passedDials{base: 0, n: 2})

	if lane, holding := n.passOrDial(kc, key, true, false); lane != -1 || holding {
		t.Fatalf("a first request passed to lane %d, held back %v; want a dial here (the sibling holds 2 by the record, as this process does)", lane, holding)
	}
	kc.dialEnds() // that decision's dial, never made
	passesTo(t, ms, kc, key, false, permit, passedDials{base: 0, n: 2}, 1)
}

// passesTo checks that a decision of the first process of a fleet, first or
// not, passes its dial to the second process, leaving kc's record of passes
// to it at want; it then hands over permit, the decision's unit, and waits
// until the second process has dialed created connections.
func passesTo(t *testing.T, ms []*member, kc *keyCap, key orbitpool.Key, first bool, permit *orbitpool.CreationPermit, want passedDials, created uint64) {
	t.Helper()
	sibling := ms[1].pool.Lane()
	lane, holding := ms[0].node.passOrDial(kc, key, first, false)
	if lane != sibling || holding {
		t.Fatalf("a request (first %v) passed to lane %d, held back %v; want lane %d, the sibling", first, lane, holding, sibling)
	}
	if p := kc.passed[sibling]; p.n != want.n || p.base != want.base {
		t.Errorf("the record counts %d passes to the sibling since it held %d; want %d since %d", p.n, p.base, want.n, want.base)
	}
	permit.CloseToward(lane)
	waitFor(t, 10*time.Second, "the sibling's waiting request on a connection it dialed", func() bool { return ms[1].node.Stats().Created == created })
}
