package proxy

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/orbitpool"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// TestDeadOwnersBudgetHeldWhileItsConnectionsLinger: cap 2, both
// connections a process owns carry requests the upstream holds for 1.5 s,
// and the process is killed. Its budget is held past ReclaimHold (200 ms)
// for as long as the upstream keeps those connections, which the host
// knows (orphaned sockets in FIN_WAIT2): a sibling's requests wait, and
// dial only once the upstream has let go, so it never holds more than 2.
// With the hold alone they dialed at about 250 ms, to a peak of 4. The
// node says, once, why the budget stays held.
func TestDeadOwnersBudgetHeldWhileItsConnectionsLinger(t *testing.T) {
	const (
		reclaimHold = 200 * time.Millisecond
		upstreamFor = 1500 * time.Millisecond
	)
	srv, counts, seg, owner := ownerHoldingTwo(t, upstreamFor)
	spec := testSpec
	spec.Path = seg
	core, logs := observer.New(zapcore.InfoLevel)
	me := newMemberPoolOpts(t, spec, orbitpool.Options{ReconcileInterval: 50 * time.Millisecond, ReclaimHold: reclaimHold},
		NodeOptions{SweepInterval: 50 * time.Millisecond, Logger: zap.New(core)}, func(tr *Transport) { tr.MaxConnsPerKey = 2 })

	killed := time.Now()
	if err := owner.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	done := getTwoAtOnce(t, me, srv.URL+"/", killed)
	// Well past the hold, the dead owner's 2 units are still held.
	time.Sleep(reclaimHold + 4*lingerRecheckForTest)
	if held := heldUnits(t, me.pool); held != 2 {
		open, _, _ := counts()
		t.Errorf("%v after the kill, with the upstream holding %d connections: %d units held, want 2",
			time.Since(killed).Round(time.Millisecond), open, held)
	}
	for range 2 {
		r := <-done
		if r.err != nil {
			t.Fatalf("a request %v after the kill: %v", r.at.Round(time.Millisecond), r.err)
		}
	}
	if _, peak, _ := counts(); peak > 2 {
		t.Fatalf("the upstream held %d connections at once, cap 2", peak)
	}
	// Once, not at every recheck.
	said := logs.FilterMessageSnippet("upstream still holds connections closed here").All()
	if len(said) != 1 || said[0].ContextMap()["connections"] != int64(2) {
		t.Errorf("logged the held connections %d times (%v), want once, with 2", len(said), said)
	}
	waitFor(t, 2*time.Second, "nothing held", func() bool { return heldUnits(t, me.pool) == 0 })
}

// TestDeadOwnersBudgetHeldByAMemberThatNeverUsedTheKey: as above, but the
// member that finds the owner dead, and holds its budget, joins after the
// kill, as a worker restarted in the dead one's place does, and has no
// request for the key until the hold has ended. The fleet told it the
// upstream's address (see remotesPrefix): it counts the dead owner's
// connections the upstream still holds and keeps their units, so requests
// sent after the hold wait for the upstream to let go, and it never holds
// more than 2. Without the address the units went back on the set time, the
// requests dialed to a peak of 4, and an upstream enforcing its cap refused
// every such dial.
func TestDeadOwnersBudgetHeldByAMemberThatNeverUsedTheKey(t *testing.T) {
	const (
		reclaimHold = 200 * time.Millisecond
		upstreamFor = 1500 * time.Millisecond
	)
	srv, counts, seg, owner := ownerHoldingTwo(t, upstreamFor)
	killed := time.Now()
	me := joinInPlaceOf(t, owner, seg, reclaimHold)
	if held := heldUnits(t, me.pool); held != 2 {
		t.Fatalf("joining after the kill: %d units held, want the dead owner's 2", held)
	}
	time.Sleep(reclaimHold + 3*lingerRecheckForTest)
	if open, _, _ := counts(); open != 2 {
		t.Fatalf("%v after the kill, the upstream holds %d connections; the test needs the owner's 2",
			time.Since(killed).Round(time.Millisecond), open)
	}
	if held := heldUnits(t, me.pool); held != 2 {
		t.Errorf("%v after the kill, past the hold, with the upstream holding the owner's 2 connections: %d units held, want 2",
			time.Since(killed).Round(time.Millisecond), held)
	}
	done := getTwoAtOnce(t, me, srv.URL+"/", killed)
	for range 2 {
		if r := <-done; r.err != nil {
			t.Fatal(r.err)
		}
	}
	if _, peak, _ := counts(); peak > 2 {
		t.Fatalf("the upstream held %d connections at once, cap 2", peak)
	}
}

// timedResult is a request's error, and when it ended.
type timedResult struct {
	err error
	at  time.Duration // since the time getTwoAtOnce was given
}

// getTwoAtOnce sends two GETs to url through m at once, each within 10s,
// and delivers their results as they end.
func getTwoAtOnce(t *testing.T, m *member, url string, since time.Time) <-chan timedResult {
	done := make(chan timedResult, 2)
	for range 2 {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			resp, err := get(t, ctx, m.tr, url)
			if err == nil {
				drain(resp)
			}
			done <- timedResult{err, time.Since(since)}
		}()
	}
	return done
}

// ownerHoldingTwo starts an upstream and, in a child process on a new
// segment (seg), a member with a cap of 2 whose two requests the upstream
// holds for d: busy with them, deaf to the client's close, and then gone
// without a word, so the close is counted before the client's kernel can
// see it. It returns once the upstream holds both requests, not only their
// connections: one the upstream only accepted it closes as soon as the
// owner dies.
func ownerHoldingTwo(t *testing.T, d time.Duration) (srv *httptest.Server, counts func() (open, peak, total int64), seg string, owner *child) {
	t.Helper()
	var busy atomic.Int64
	srv, counts = countingUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if ms, err := strconv.Atoi(r.URL.Query().Get("hold")); err == nil {
			c, _, err := w.(http.Hijacker).Hijack()
			if err != nil {
				return
			}
			busy.Add(1)
			time.Sleep(time.Duration(ms) * time.Millisecond)
			c.Close()
			return
		}
		io.WriteString(w, "ok")
	}))
	seg = filepath.Join(t.TempDir(), "seg")
	owner = startChild(t, seg, srv.URL, 0, 2)
	owner.send(t, "hang 2 "+strconv.Itoa(int(d/time.Millisecond)))
	owner.expect(t, "hung")
	waitFor(t, 5*time.Second, "the upstream to hold the owner's 2 requests", func() bool {
		open, _, _ := counts()
		return open == 2 && busy.Load() == 2
	})
	return srv, counts, seg, owner
}

// joinInPlaceOf kills owner, a member of seg, and once it has exited joins
// seg with a cap of 2 and reclaimHold, as a worker restarted in its place
// does: it finds the owner dead as it joins, and holds its budget.
func joinInPlaceOf(t *testing.T, owner *child, seg string, reclaimHold time.Duration) *member {
	t.Helper()
	if err := owner.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	owner.cmd.Process.Wait()
	spec := testSpec
	spec.Path = seg
	return newMemberPoolOpts(t, spec, orbitpool.Options{ReconcileInterval: 50 * time.Millisecond, ReclaimHold: reclaimHold},
		NodeOptions{SweepInterval: 50 * time.Millisecond}, func(tr *Transport) { tr.MaxConnsPerKey = 2 })
}

// lingerRecheckForTest is orbitpool's recheck of a lingering hold (100 ms).
const lingerRecheckForTest = 100 * time.Millisecond

// heldUnits is how many units of budget p's fleet holds back, over all keys.
func heldUnits(t *testing.T, p *orbitpool.Pool) int {
	t.Helper()
	return sumKeys(t, p, func(k orbitpool.KeyStats) int { return k.Held })
}
