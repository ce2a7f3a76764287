package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/governor"
	"github.com/orbitproxy/orbit/orbitpool"
)

// adv77dStages are the instants at which a request is cut short:
//
//	capwait   waiting for capacity (the key's one connection is busy)
//	leasewait the owner waiting for a worker for the sibling's lease
//	          (remote only; its Governor's one worker is busy)
//	bodysend  the request body half sent, the writer blocked in Read
//	respbody  after the response head, during the response body read
//	early     resp.Body.Close right after RoundTrip, the body half read
var adv77dStages = []string{"capwait", "leasewait", "bodysend", "respbody", "early"}

// adv77dActors are what cuts it short: the request's context cancelled,
// its deadline passing, or the owner's Node leaving (Shutdown with a short
// drain, or Close). For "early" the Close of the response body is the cut
// ("none"), alone or together with the owner leaving.
func adv77dActors(stage string) []string {
	if stage == "early" {
		return []string{"none", "shutdown", "close"}
	}
	return []string{"cancel", "deadline", "shutdown", "close"}
}

const adv77dDeadline = 1500 * time.Millisecond

// TestAdv77dCancelEveryStage*: for every stage and actor, local path and
// remote hop, plain TCP and TLS upstreams (HTTP/1.1):
//   - RoundTrip (and resp.Body.Close) return in bounded time, and no Read
//     or Close of req.Body begins after RoundTrip returned with an error,
//     or after resp.Body.Close returned, and no Read is still under way
//     at that moment;
//   - a failure is an *Error; RetrySafe only when the upstream received
//     no head of the request; a wait cut short sent nothing upstream; a
//     failure after the head reached the upstream is not retry-safe;
//   - a response body cut short never ends as a clean EOF;
//   - nothing is lost: no exchange active on either server, every unit of
//     the table back (no use, no pending reservation), the next requests
//     (local, sibling, and a process that joins afterwards) answered with
//     the right body, the idle connections then closable to none live, the
//     upstream left with no connection open, and the goroutines back near
//     where they were once every member has closed.
func TestAdv77dCancelEveryStagePlainLocal(t *testing.T)  { adv77dStagesFor(t, false, false) }
func TestAdv77dCancelEveryStagePlainRemote(t *testing.T) { adv77dStagesFor(t, false, true) }
func TestAdv77dCancelEveryStageTLSLocal(t *testing.T)    { adv77dStagesFor(t, true, false) }
func TestAdv77dCancelEveryStageTLSRemote(t *testing.T)   { adv77dStagesFor(t, true, true) }

func adv77dStagesFor(t *testing.T, useTLS, remote bool) {
	for _, stage := range adv77dStages {
		if stage == "leasewait" && !remote {
			continue
		}
		for _, actor := range adv77dActors(stage) {
			t.Run(stage+"/"+actor, func(t *testing.T) {
				adv77dCase(t, useTLS, remote, stage, actor, false)
			})
		}
	}
}

type adv77dRT struct {
	resp *http.Response
	err  error
}

// adv77dCase runs one case; strictType also requires a failure to be the
// error doc.go names for its actor.
func adv77dCase(t *testing.T, useTLS, remote bool, stage, actor string, strictType bool) {
	baseG := runtime.NumGoroutine()
	upA := newAdv77dUp(t, useTLS)
	var upB *adv77dUp
	if stage == "leasewait" {
		upB = newAdv77dUp(t, useTLS)
	}
	spec := orbitpool.PoolSpec{Lanes: 4, Keys: 8, ResourcesPerLane: 16, Path: filepath.Join(t.TempDir(), "seg")}
	conf := func(tr *Transport) {
		tr.MaxConnsPerKey = 1
		tr.TLSClientConfig = upA.cc
	}
	oopts := NodeOptions{SweepInterval: 50 * time.Millisecond, MaxLeaseWait: 5 * time.Second}
	if stage == "leasewait" {
		oopts.Governor = governor.New(1, 64<<20)
	}
	owner := newMemberOpts(t, spec, oopts, conf)
	client := newMemberOpts(t, spec, NodeOptions{SweepInterval: 50 * time.Millisecond}, conf)
	members := []*member{owner, client}
	defer func() {
		for _, m := range members {
			m.node.Close()
			m.pool.Close()
		}
	}()
	subject := owner
	if remote {
		subject = client
	}
	// The owner owns the one connection to A (and to B).
	if r := adv77bDo(owner.tr, "GET", upA.url+"/warm", nil, 0, nil, 5*time.Second); r.err != nil || r.body != "ok" {
		t.Fatalf("warm A: %v", r)
	}
	if upB != nil {
		if r := adv77bDo(owner.tr, "GET", upB.url+"/warm", nil, 0, nil, 5*time.Second); r.err != nil || r.body != "ok" {
			t.Fatalf("warm B: %v", r)
		}
	}
	keyOf := func(url string) orbitpool.Key {
		req, _ := http.NewRequest("GET", url, nil)
		_, k, err := owner.tr.Upstream(req)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	keys := []orbitpool.Key{keyOf(upA.url)}
	if upB != nil {
		keys = append(keys, keyOf(upB.url))
	}
	servedBefore := owner.node.Stats().ServedRemote

	// A holder keeps the connection (capwait) or the owner's one worker
	// (leasewait) busy.
	var holder *http.Response
	closeHolder := func() {
		if holder != nil {
			io.Copy(io.Discard, holder.Body)
			holder.Body.Close()
			holder = nil
		}
	}
	defer closeHolder()
	if stage == "capwait" || stage == "leasewait" {
		hu := upA
		if stage == "leasewait" {
			hu = upB
		}
		req, _ := http.NewRequest("GET", hu.url+"/held", nil)
		resp, err := owner.tr.RoundTrip(req)
		if err != nil {
			t.Fatalf("holder: %v", err)
		}
		holder = resp
		buf := make([]byte, 5)
		if _, err := io.ReadFull(resp.Body, buf); err != nil || string(buf) != "first" {
			t.Fatalf("holder's first bytes: %q %v", buf, err)
		}
	}

	// The request under test.
	const size = 64 << 10
	var body *adv77dBody
	var reqPath string
	switch stage {
	case "capwait", "leasewait":
		body, reqPath = newAdv77dBody(size, size), "/echo"
	case "bodysend":
		body, reqPath = newAdv77dBody(size, 1024), "/echo"
	default:
		// No request body here: the writer's last read of a body may come
		// after the response (TestAdv77dWriterDoneByBodyClose checks
		// that deterministically, on its own).
		reqPath = "/held"
	}
	var reqBody io.Reader
	if body != nil {
		defer body.Close()
		reqBody = body
	}
	var ctx context.Context
	var cancel context.CancelFunc
	if actor == "deadline" {
		ctx, cancel = context.WithTimeout(context.Background(), adv77dDeadline)
	} else {
		ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
	}
	defer cancel()
	method := "GET"
	if body != nil {
		method = "POST"
	}
	req, _ := http.NewRequestWithContext(ctx, method, upA.url+reqPath, reqBody)
	if body != nil {
		req.ContentLength = int64(body.size)
	}
	rtDone := make(chan adv77dRT, 1)
	start := time.Now()
	go func() {
		resp, err := subject.tr.RoundTrip(req)
		if err != nil && body != nil {
			body.markDone()
		}
		rtDone <- adv77dRT{resp, err}
	}()

	// Reach the stage.
	var early *adv77dRT
	switch stage {
	case "capwait":
		time.Sleep(200 * time.Millisecond)
	case "leasewait":
		waitFor(t, 3*time.Second, "the lease to reach the owner", func() bool { return owner.node.srv.active.Load() >= 1 })
		time.Sleep(100 * time.Millisecond)
	case "bodysend":
		waitFor(t, 5*time.Second, "the upstream to get the head and the writer to wait in the body", func() bool {
			return upA.count(reqPath) == 1 && body.inRead.Load() > 0
		})
	}
	if stage == "capwait" || stage == "leasewait" {
		select {
		case r := <-rtDone:
			early = &r
		default:
		}
		if early != nil {
			t.Fatalf("setup: the request did not wait at %s: %v", stage, early.err)
		}
		if n := upA.count(reqPath); n != 0 {
			t.Fatalf("setup: the upstream got %d heads while the request should wait", n)
		}
	}
	if stage == "leasewait" && owner.node.Stats().ServedRemote != servedBefore {
		// (ServedRemote counts finished exchanges; none may have run.)
		t.Fatalf("setup: the lease was served while the owner's worker was busy")
	}
	if actor == "deadline" && stage != "respbody" && time.Since(start) > adv77dDeadline-100*time.Millisecond {
		t.Fatalf("setup: the stage was reached only %v after the request began, too late for its deadline", time.Since(start))
	}

	leaveDone := make(chan struct{})
	left := false
	leave := func() {
		left = true
		go func() {
			defer close(leaveDone)
			switch actor {
			case "shutdown":
				sctx, scancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
				defer scancel()
				owner.node.Shutdown(sctx)
			case "close":
				owner.node.Close()
			}
		}()
	}
	act := func() {
		switch actor {
		case "cancel":
			cancel()
		case "shutdown", "close":
			leave()
		}
	}

	switch stage {
	case "capwait", "leasewait", "bodysend":
		act()
		var r adv77dRT
		select {
		case r = <-rtDone:
		case <-time.After(8 * time.Second):
			body.Close()
			t.Fatalf("RoundTrip did not return within 8s of %s at %s (a slow body yields every %v)", actor, stage, adv77dTick)
		}
		got := upA.count(reqPath)
		if r.err == nil {
			b, err := io.ReadAll(r.resp.Body)
			r.resp.Body.Close()
			body.markDone()
			if stage == "bodysend" {
				t.Errorf("RoundTrip succeeded (%d %d bytes, %v) though the body never ended", r.resp.StatusCode, len(b), err)
			} else if actor == "cancel" || actor == "deadline" {
				t.Errorf("RoundTrip succeeded after its context ended at %s", stage)
			} else if err != nil || string(b) != strings.Repeat("x", size) {
				t.Errorf("after the owner left at %s: a wrong answer: %d bytes, %v", stage, len(b), err)
			}
		} else {
			t.Logf("%s at %s: %T %v (retry-safe %v, upstream heads %d)", actor, stage, r.err, r.err, IsRetrySafe(r.err), got)
			var pe *Error
			if !errors.As(r.err, &pe) && !isContextErr(r.err) {
				t.Errorf("%s at %s: error %T %q is not an *Error", actor, stage, r.err, r.err)
			}
			if IsRetrySafe(r.err) && got != 0 {
				t.Errorf("%s at %s: retry-safe error %q though the upstream received %d heads of the request", actor, stage, r.err, got)
			}
			if strictType {
				want := map[string]error{"cancel": context.Canceled, "deadline": context.DeadlineExceeded, "shutdown": ErrClosed, "close": ErrClosed}[actor]
				if !errors.Is(r.err, want) {
					t.Errorf("%s at %s: error %q, want one that is %q", actor, stage, r.err, want)
				}
			}
			if stage == "bodysend" && IsRetrySafe(r.err) {
				t.Errorf("bodysend: error %q is retry-safe though the upstream has the head", r.err)
			}
		}
		if (stage == "capwait" || stage == "leasewait") && (actor == "cancel" || actor == "deadline") && got != 0 {
			t.Errorf("%s at %s: the upstream received %d heads of a request cut short while waiting", actor, stage, got)
		}
		if stage == "bodysend" && got != 1 {
			t.Errorf("bodysend: the upstream received %d heads, want 1 (no resend of a non-replayable body)", got)
		}
	case "respbody", "early":
		var r adv77dRT
		select {
		case r = <-rtDone:
		case <-time.After(8 * time.Second):
			t.Fatalf("RoundTrip did not return")
		}
		if r.err != nil {
			t.Fatalf("RoundTrip: %v", r.err)
		}
		if remote && owner.node.Stats().ServedRemote == servedBefore && owner.node.srv.active.Load() == 0 {
			t.Fatalf("setup: the request did not go through the owner")
		}
		buf := make([]byte, 5)
		if _, err := io.ReadFull(r.resp.Body, buf); err != nil || string(buf) != "first" {
			t.Fatalf("first bytes: %q %v", buf, err)
		}
		if stage == "respbody" {
			act()
			type rd struct {
				b   []byte
				err error
			}
			ch := make(chan rd, 1)
			go func() {
				b, err := io.ReadAll(r.resp.Body)
				ch <- rd{b, err}
			}()
			select {
			case x := <-ch:
				if x.err == nil {
					t.Errorf("respbody: after %s the body ended cleanly with %q: a cut body read as complete", actor, x.b)
				}
			case <-time.After(8 * time.Second):
				r.resp.Body.Close()
				t.Fatalf("respbody: the body read hung 8s after %s", actor)
			}
		} else if actor != "none" {
			act()
		}
		cdone := make(chan struct{})
		go func() { r.resp.Body.Close(); close(cdone) }()
		select {
		case <-cdone:
		case <-time.After(5 * time.Second):
			t.Fatalf("resp.Body.Close hung")
		}
		if n := upA.count(reqPath); n != 1 {
			t.Errorf("the upstream received %d heads, want 1", n)
		}
	}
	// Anything still running of the attempt would touch the body soon.
	time.Sleep(200 * time.Millisecond)
	if body == nil {
		// nothing to check
	} else if n, c, a := body.lateReads.Load(), body.lateCloses.Load(), body.readAtDone.Load(); n+c+a != 0 {
		t.Errorf("%s at %s: req.Body touched after RoundTrip/resp.Body.Close returned: %d reads began, %d closes, %d reads under way", actor, stage, n, c, a)
	}
	if left {
		select {
		case <-leaveDone:
		case <-time.After(8 * time.Second):
			t.Fatalf("the owner's %s hung", actor)
		}
	}
	upA.releaseAll()
	if upB != nil {
		upB.releaseAll()
	}
	closeHolder()

	// Nothing lost.
	for _, m := range members {
		m := m
		waitFor(t, 5*time.Second, "no active exchange on a server", func() bool { return m.node.srv.active.Load() == 0 })
	}
	alive := []*member{client}
	if !left {
		alive = []*member{owner, client}
	}
	newcomer := newMemberOpts(t, spec, NodeOptions{SweepInterval: 50 * time.Millisecond}, conf)
	members = append(members, newcomer)
	alive = append(alive, newcomer)
	for i, m := range alive {
		want := strings.Repeat("y", 100+i)
		r := adv77bDo(m.tr, "POST", upA.url+"/echo", strings.NewReader(want), int64(len(want)), nil, 5*time.Second)
		if r.err != nil || r.status != 200 || r.body != want {
			t.Errorf("next request from member %d: %v", i, r)
		}
	}
	for _, k := range keys {
		waitFor(t, 5*time.Second, "every unit of the table back", func() bool {
			cs, err := client.pool.Candidates(k, nil)
			if err != nil {
				return false
			}
			for _, c := range cs {
				if c.InUse != 0 || c.Pending != 0 {
					return false
				}
			}
			return true
		})
		closeIdleUntilGone(t, k, 5*time.Second, alive...)
	}
	waitFor(t, 5*time.Second, "the upstream's connections closed", func() bool {
		n := upA.open()
		if upB != nil {
			n += upB.open()
		}
		return n == 0
	})
	for _, m := range members {
		m.node.Close()
		m.pool.Close()
	}
	upA.stop()
	if upB != nil {
		upB.stop()
	}
	const slack = 6
	end := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > baseG+slack && time.Now().Before(end) {
		time.Sleep(20 * time.Millisecond)
	}
	if g := runtime.NumGoroutine(); g > baseG+slack {
		buf := make([]byte, 1<<20)
		n := runtime.Stack(buf, true)
		t.Errorf("%d goroutines left, %d before the test (slack %d):\n%s", g, baseG, slack, buf[:n])
	}
}

// TestAdv77dCancelErrorIsTyped: the errors doc.go names for a request cut
// short. One whose own context ended (cancelled, deadline passed) while it
// waits for capacity, while the owner waits for a worker for its lease, or
// while its body is being sent (local path and remote hop) fails with that
// context's error; one whose own Node closed while it waits for capacity,
// with ErrClosed. Neither is retry-safe once the upstream has a head of it.
func TestAdv77dCancelErrorIsTyped(t *testing.T) {
	for _, c := range []struct {
		remote bool
		stage  string
		actors []string
	}{
		{true, "capwait", []string{"cancel", "deadline"}},
		{false, "capwait", []string{"cancel", "deadline", "shutdown", "close"}},
		{true, "leasewait", []string{"cancel", "deadline"}},
		{false, "bodysend", []string{"cancel", "deadline"}},
		{true, "bodysend", []string{"cancel", "deadline"}},
	} {
		for _, actor := range c.actors {
			t.Run(fmt.Sprintf("remote=%v/%s/%s", c.remote, c.stage, actor), func(t *testing.T) {
				adv77dCase(t, false, c.remote, c.stage, actor, true)
			})
		}
	}
}
