package proxy

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/governor"
)

// adv77cScript answers /slow with "ok" after 100ms, and the rest as
// adv77bScript does.
func adv77cScript(release <-chan struct{}) adv10Answer {
	base := adv77bScript(release, func() {})
	return func(c net.Conn, br *bufio.Reader, req *http.Request, conn, n int) bool {
		if req.URL.Path == "/slow" {
			io.Copy(io.Discard, req.Body)
			time.Sleep(100 * time.Millisecond)
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
			return true
		}
		return base(c, br, req, conn, n)
	}
}

// adv77cSetup is an owner with one worker, held by its own exchange with
// another upstream (/held, until release), an idle connection of its own to
// u (the fleet's only one allowed), and two siblings whose requests to u
// lease it and so wait for the owner's worker (MaxLeaseWait 4s).
type adv77cSetup struct {
	u, held       *adv10Upstream
	owner         *member
	sibs          []*member
	heldBody      io.ReadCloser
	rel           func()
	want          adv77bResult
	heldReleased  chan struct{} // closed once the owner's own exchange gave its worker back
	releaseWorker func()
}

func newAdv77cSetup(t *testing.T, withTLS bool) *adv77cSetup {
	t.Helper()
	release, rel := adv77bRelease(t)
	st := &adv77cSetup{rel: rel, heldReleased: make(chan struct{})}
	st.held = newAdv10Upstream(t, false, adv77bScript(release, func() {}))
	st.u = newAdv10Upstream(t, withTLS, adv77cScript(nil))
	st.want = adv77bDo(adv77bRef(t, st.u), "GET", st.u.url("/slow"), nil, 0, nil, 5*time.Second)
	spec := testSpec
	spec.Path = t.TempDir() + "/seg"
	conf := st.u.conf(func(tr *Transport) { tr.MaxConnsPerKey = 1 })
	st.owner = newMemberOpts(t, spec, NodeOptions{SweepInterval: 50 * time.Millisecond, Governor: governor.New(1, 0), MaxLeaseWait: 4 * time.Second}, conf)
	st.sibs = []*member{newMember(t, spec, conf), newMember(t, spec, conf)}
	warm(t, st.owner, st.u.url("/"))
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	t.Cleanup(cancel)
	req, _ := http.NewRequestWithContext(ctx, "GET", st.held.url("/held"), nil)
	resp, err := st.owner.tr.RoundTrip(req)
	if err != nil {
		t.Fatalf("the owner's held request: %v", err)
	}
	if _, err := io.ReadFull(resp.Body, make([]byte, 5)); err != nil {
		resp.Body.Close()
		t.Fatalf("the held response: %v", err)
	}
	st.heldBody = resp.Body
	var once sync.Once
	st.releaseWorker = func() {
		once.Do(func() {
			rel()
			io.Copy(io.Discard, st.heldBody)
			st.heldBody.Close()
			close(st.heldReleased)
		})
	}
	t.Cleanup(st.releaseWorker)
	return st
}

// send starts n requests for path, alternating between the siblings, and
// returns their results' channel and a wait for all of them.
func (st *adv77cSetup) send(n int, path string) (chan adv77bResult, func(d time.Duration) bool) {
	results := make(chan adv77bResult, n)
	var wg sync.WaitGroup
	for i := range n {
		m := st.sibs[i%len(st.sibs)]
		wg.Add(1)
		go func() {
			defer wg.Done()
			results <- adv77bDo(m.tr, "GET", st.u.url(path), nil, 0, nil, 12*time.Second)
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	return results, func(d time.Duration) bool {
		select {
		case <-done:
			close(results)
			return true
		case <-time.After(d):
			return false
		}
	}
}

// check fails t unless every result is net/http's answer.
func (st *adv77cSetup) check(t *testing.T, what string, results chan adv77bResult) {
	t.Helper()
	fails := 0
	for r := range results {
		if r.err != nil {
			fails++
			t.Errorf("%s: a sibling request failed: %v", what, r.err)
			continue
		}
		adv77bSame(t, what, r, st.want)
	}
	if fails != 0 {
		t.Errorf("%s: %d sibling request(s) failed; net/http.Transport serves every one", what, fails)
	}
}

// slowSeen counts the /slow requests u has read.
func (st *adv77cSetup) slowSeen() int {
	n := 0
	for _, r := range st.u.requests() {
		if strings.HasSuffix(r, " /slow") {
			n++
		}
	}
	return n
}

// TestAdv77cShutdownAtWorkerHandoff: siblings' leases wait for the owner's
// only worker; the owner's own exchange gives it back at about the same
// instant as Shutdown (8s grace) begins, in either order and a few
// offsets apart, so that a lease gets the worker as the drain ends the
// wait. A lease that got it is served to its end (the upstream takes
// 100ms) and Shutdown waits for it; the others are refused, retry-safe,
// and served elsewhere. Every sibling request gets net/http's answer, the
// upstream reads each exactly once, and Shutdown returns well within its
// grace; Close after it returns at once.
func TestAdv77cShutdownAtWorkerHandoff(t *testing.T) {
	offsets := []time.Duration{-time.Millisecond, -100 * time.Microsecond, 0, 100 * time.Microsecond, time.Millisecond}
	for i, off := range offsets {
		withTLS := i%2 == 1
		t.Run(off.String(), func(t *testing.T) {
			st := newAdv77cSetup(t, withTLS)
			const n = 4
			results, wait := st.send(n, "/slow")
			time.Sleep(300 * time.Millisecond) // all waiting on the worker
			if k := len(results); k != 0 {
				t.Fatalf("setup: %d of %d requests ended before the owner's worker came free", k, n)
			}
			shut := make(chan error, 1)
			shutdown := func() {
				go func() {
					ctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
					defer cancel()
					shut <- st.owner.node.Shutdown(ctx)
				}()
			}
			start := time.Now()
			if off < 0 {
				go st.releaseWorker()
				time.Sleep(-off)
				shutdown()
			} else {
				shutdown()
				time.Sleep(off)
				go st.releaseWorker()
			}
			if !wait(12 * time.Second) {
				t.Fatal("sibling requests hung as the owner drained")
			}
			st.check(t, "a request waiting on the owner's worker at its drain", results)
			select {
			case err := <-shut:
				if err != nil {
					t.Errorf("Shutdown: %v", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("Shutdown did not return within 10s")
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Errorf("Shutdown took %v with nothing left but 100ms exchanges", d.Round(time.Millisecond))
			}
			if a := st.owner.node.srv.active.Load(); a != 0 {
				t.Errorf("Shutdown returned with %d siblings' exchanges still counted", a)
			}
			if got := st.slowSeen(); got != n+1 { // +1: the reference
				t.Errorf("the upstream read /slow %d times for %d requests and the reference; want each once", got, n)
			}
			closed := make(chan error, 1)
			go func() { closed <- st.owner.node.Close() }()
			select {
			case err := <-closed:
				if err != nil {
					t.Errorf("Close after Shutdown: %v", err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("Close after Shutdown hung")
			}
		})
	}
}

// TestAdv77cShutdownCtxDone: Shutdown called with its context already
// ended, while siblings' leases wait for the owner's worker: it returns
// promptly, the waiting requests are refused retry-safe and served
// elsewhere with net/http's answer (none fails), and a later Shutdown or
// Close returns at once.
func TestAdv77cShutdownCtxDone(t *testing.T) {
	for _, withTLS := range []bool{false, true} {
		name := "plain"
		if withTLS {
			name = "tls"
		}
		t.Run(name, func(t *testing.T) {
			st := newAdv77cSetup(t, withTLS)
			results, wait := st.send(4, "/slow")
			time.Sleep(300 * time.Millisecond)
			if k := len(results); k != 0 {
				t.Fatalf("setup: %d of 4 requests ended before the owner's worker came free", k)
			}
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			start := time.Now()
			st.owner.node.Shutdown(ctx)
			if d := time.Since(start); d > 3*time.Second {
				t.Errorf("Shutdown with its context done took %v", d.Round(time.Millisecond))
			}
			if !wait(12 * time.Second) {
				t.Fatal("sibling requests hung as the owner left")
			}
			st.check(t, "a request waiting on the owner's worker as it left", results)
			for _, f := range []func() error{
				func() error { return st.owner.node.Shutdown(context.Background()) },
				st.owner.node.Close,
			} {
				done := make(chan error, 1)
				go func() { done <- f() }()
				select {
				case <-done:
				case <-time.After(3 * time.Second):
					t.Fatal("Shutdown or Close after a finished Shutdown hung")
				}
			}
		})
	}
}

// TestAdv77cShutdownUnderLoad: two siblings keep sending requests to u,
// which they can only lease from the owner (its connection is the fleet's
// one allowed) and which wait for the owner's only worker; the owner's
// own exchange gives the worker back and Shutdown begins at once, while
// the load goes on for 600ms after. Every request is served with
// net/http's answer: those that waited, those the drain refused and those
// sent during and after the drain.
func TestAdv77cShutdownUnderLoad(t *testing.T) {
	st := newAdv77cSetup(t, false)
	waiting, waitFirst := st.send(4, "/slow")
	time.Sleep(300 * time.Millisecond)
	var stop atomic.Bool
	var wg sync.WaitGroup
	load := make(chan adv77bResult, 256)
	for _, m := range st.sibs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				r := adv77bDo(m.tr, "GET", st.u.url("/"), nil, 0, nil, 12*time.Second)
				select {
				case load <- r:
				default:
				}
			}
		}()
	}
	time.Sleep(20 * time.Millisecond)
	shut := make(chan error, 1)
	go st.releaseWorker()
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
		defer cancel()
		shut <- st.owner.node.Shutdown(ctx)
	}()
	time.Sleep(600 * time.Millisecond)
	stop.Store(true)
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(13 * time.Second):
		t.Fatal("the siblings' load hung as the owner drained")
	}
	close(load)
	if !waitFirst(12 * time.Second) {
		t.Fatal("the waiting sibling requests hung")
	}
	st.check(t, "a request waiting on the owner's worker at its drain", waiting)
	n, fails := 0, 0
	for r := range load {
		n++
		if r.err != nil || r.status != 200 || r.body != "ok" {
			fails++
			if fails <= 3 {
				t.Errorf("a sibling request sent around the owner's drain: %v", r)
			}
		}
	}
	if fails != 0 {
		t.Errorf("%d of %d sibling requests sent around the drain failed; net/http.Transport serves every one", fails, n)
	}
	if n == 0 {
		t.Error("no load request completed")
	}
	select {
	case err := <-shut:
		if err != nil {
			t.Errorf("Shutdown: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Shutdown did not return")
	}
}

// adv77cOnce is a request body that cannot be replayed: no GetBody.
type adv77cOnce struct{ r io.Reader }

func (o *adv77cOnce) Read(p []byte) (int, error) { return o.r.Read(p) }

// TestAdv77cShutdownRefusesBodies: siblings' requests with bodies that
// cannot be replayed (no GetBody), small (sent with the head), large and
// of unknown length, wait on the owner's only worker when Shutdown (8s
// grace) begins; the owner's own exchange gives the worker back 200ms
// later, well within the grace and the lease wait. Before the drain ended
// the leases' wait the owner served them then; now they are refused at
// once, and must still be served (elsewhere): a refusal the sender cannot
// retry for want of its body would fail a request net/http.Transport
// serves. Each gets the upstream's answer, and the upstream read each
// body whole, once.
func TestAdv77cShutdownRefusesBodies(t *testing.T) {
	bodies := []struct {
		name string
		size int64 // -1: unknown length
	}{{"small", 100}, {"large", 256 << 10}, {"unknown", -1}}
	for _, b := range bodies {
		t.Run(b.name, func(t *testing.T) {
			st := newAdv77cSetup(t, false)
			const n = 3
			body := strings.Repeat("x", 1000)
			if b.size > 0 {
				body = strings.Repeat("x", int(b.size))
			}
			results := make(chan adv77bResult, n)
			var wg sync.WaitGroup
			for i := range n {
				m := st.sibs[i%len(st.sibs)]
				wg.Add(1)
				go func() {
					defer wg.Done()
					size := b.size
					if size < 0 {
						size = 0
					}
					results <- adv77bDo(m.tr, "POST", st.u.url("/slow"), &adv77cOnce{strings.NewReader(body)}, size, nil, 12*time.Second)
				}()
			}
			time.Sleep(300 * time.Millisecond)
			if k := len(results); k != 0 {
				t.Fatalf("setup: %d of %d POSTs ended before the owner's worker came free", k, n)
			}
			shut := make(chan error, 1)
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
				defer cancel()
				shut <- st.owner.node.Shutdown(ctx)
			}()
			time.Sleep(200 * time.Millisecond)
			go st.releaseWorker()
			done := make(chan struct{})
			go func() { wg.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(13 * time.Second):
				t.Fatal("sibling POSTs hung as the owner drained")
			}
			close(results)
			fails := 0
			for r := range results {
				if r.err != nil || r.status != 200 || r.body != "ok" {
					fails++
					t.Errorf("a sibling POST (%s body, not replayable) waiting at the drain: %v", b.name, r)
				}
			}
			if fails != 0 {
				t.Errorf("%d of %d POSTs failed; net/http.Transport serves each", fails, n)
			}
			if got := st.slowSeen(); got != n+1 {
				t.Errorf("the upstream read /slow %d times for %d POSTs and the reference GET; want each once", got, n)
			}
			select {
			case err := <-shut:
				if err != nil {
					t.Errorf("Shutdown: %v", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("Shutdown did not return")
			}
		})
	}
}
