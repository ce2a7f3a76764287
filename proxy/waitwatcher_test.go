package proxy

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/governor"
)

// recordWaits is a WaitWatcher that records what it is told, in order, and
// closes wrote (if set) the first time it is told the head is out.
type recordWaits struct {
	mu     sync.Mutex
	events []string
	wrote  chan struct{}
	left   time.Duration // what WaitLeft says
	retry  func()        // called by Retrying, if set, after it records
	// ownerWaited sums what OwnerWaited is told, apart from events: it
	// comes on the reading goroutine, in no fixed order with WroteHeaders.
	ownerWaited time.Duration
}

func (r *recordWaits) OwnerWaited(d time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ownerWaited += d
}

func (r *recordWaits) ownerWait() time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ownerWaited
}

func (r *recordWaits) WaitLeft() time.Duration { return r.left }

func (r *recordWaits) WroteHeaders() { r.add("wrote") }

func (r *recordWaits) Retrying(refused bool) {
	if refused {
		r.add("retry-refused")
	} else {
		r.add("retry")
	}
	if r.retry != nil {
		r.retry()
	}
}

func (r *recordWaits) add(e string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if e == "wrote" && r.wrote != nil && !slices.Contains(r.events, "wrote") {
		close(r.wrote)
	}
	r.events = append(r.events, e)
}

func (r *recordWaits) got() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return strings.Join(r.events, " ")
}

// TestWroteHeadersOnEveryPath: WithWaitWatcher's watcher is told once a
// request's head is out and before its body is, on the worker's own
// connection and through a sibling, over HTTP/1.1 and h2c, with and
// without Expect: 100-continue. The second half of each upload is sent only
// once the watcher has been told, so a transport that told it with the
// body's end or with the response hangs the request until its deadline. The caller's own trace still sees WroteHeaders, once.
func TestWroteHeadersOnEveryPath(t *testing.T) {
	const half = 8 << 10
	answer := func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		fmt.Fprint(w, n)
	}
	for _, proto := range []string{"http1", "h2c"} {
		for _, path := range []string{"local", "remote"} {
			t.Run(proto+"/"+path, func(t *testing.T) {
				var url string
				var conf func(*Transport)
				if proto == "h2c" {
					url, conf = newH2CServer(t, answer).url, h2cConf
				} else {
					ts := httptest.NewServer(http.HandlerFunc(answer))
					t.Cleanup(ts.Close)
					url = ts.URL
				}
				var rt http.RoundTripper
				var owner *member
				if path == "local" {
					rt = localTransportMember(t, conf).tr
				} else {
					var client *member
					owner, client = remotePair(t, conf)
					warm(t, owner, url)
					rt = client.tr
				}
				for _, c := range []struct {
					name, method string
					expect       bool
				}{{"GET", "GET", false}, {"POST", "POST", false}, {"POST with Expect", "POST", true}} {
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					defer cancel()
					var own atomic.Int32
					w := &recordWaits{wrote: make(chan struct{})}
					ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{WroteHeaders: func() { own.Add(1) }})
					ctx = WithWaitWatcher(ctx, w)
					wrote := w.wrote
					var body io.Reader
					want := "0"
					if c.method == "POST" {
						pr, pw := io.Pipe()
						go func() {
							pw.Write(make([]byte, half))
							select {
							case <-wrote:
								pw.Write(make([]byte, half))
								pw.Close()
							case <-ctx.Done():
								pw.CloseWithError(ctx.Err())
							}
						}()
						body, want = pr, fmt.Sprint(2*half)
					}
					req, err := http.NewRequestWithContext(ctx, c.method, url, body)
					if err != nil {
						t.Fatal(err)
					}
					if c.expect {
						req.Header.Set("Expect", "100-continue")
					}
					resp, err := rt.RoundTrip(req)
					if err != nil {
						t.Fatalf("%s: %v (watcher told %q)", c.name, err, w.got())
					}
					b, err := io.ReadAll(resp.Body)
					resp.Body.Close()
					if err != nil || string(b) != want {
						t.Fatalf("%s: body %q, %v; want %q", c.name, b, err, want)
					}
					if got := w.got(); got != "wrote" || own.Load() != 1 {
						t.Errorf("%s: watcher told %q, the caller's WroteHeaders called %d times; want \"wrote\" and 1", c.name, got, own.Load())
					}
				}
				if owner != nil {
					if s := owner.node.Stats(); s.ServedRemote < 3 {
						t.Errorf("the owner served %d of the sibling's requests, want 3: %+v", s.ServedRemote, s)
					}
				}
			})
		}
	}
}

// busyOwner is a pair whose owner has a connection to the upstream and its
// one worker taken: a sibling's lease on that connection waits up to
// maxLeaseWait for the worker, then is refused as busy. The client may dial
// a connection of its own.
func busyOwner(t *testing.T, maxLeaseWait time.Duration) (u *testUpstream, owner, client *member) {
	t.Helper()
	u = newTestUpstream(t)
	gov := governor.New(1, 0)
	owner, client = budgetFleet(t, NodeOptions{Governor: gov, MaxLeaseWait: maxLeaseWait},
		func(tr *Transport) { tr.MaxConnsPerKey = 2 })
	warm(t, owner, u.url("/cl"))
	held := gov.Acquire()
	t.Cleanup(held.Release)
	return u, owner, client
}

// sendPastBusyOwner sends req, whose context carries w, from client, and
// requires it answered after owner refused it once as busy.
func sendPastBusyOwner(t *testing.T, owner, client *member, req *http.Request, w *recordWaits) {
	t.Helper()
	resp, err := client.tr.RoundTrip(req)
	if err != nil {
		t.Fatalf("%v (watcher told %q)", err, w.got())
	}
	drain(resp)
	if n := owner.node.Stats().RefusedBy["busy"]; n != 1 {
		t.Fatalf("the owner refused %d requests as busy, want 1 (setup)", n)
	}
}

// TestRetryAfterAnOwnersRefusalWaitsAgain: a sibling whose owner refuses it
// as busy (its one worker taken past MaxLeaseWait) was told that its head
// was out, on the unix stream; the transport then tells the watcher it
// sends the request again, refused, before the retry's head, so that a
// wait timeout bounds the retry's wait for a connection too, counting the
// time the owner kept it.
func TestRetryAfterAnOwnersRefusalWaitsAgain(t *testing.T) {
	u, owner, client := busyOwner(t, 200*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	w := &recordWaits{}
	req, _ := http.NewRequestWithContext(WithWaitWatcher(ctx, w), "POST", u.url("/cl"), bytes.NewReader([]byte("payload")))
	req.Header.Set("Idempotency-Key", "1") // replayable: the sibling's idle connection first
	sendPastBusyOwner(t, owner, client, req, w)
	if got := w.got(); got != "wrote retry-refused wrote" {
		t.Errorf("watcher told %q, want \"wrote retry-refused wrote\"", got)
	}
}

// TestOwnerWaitsNoLongerThanTheCaller: a sibling's request that finds its
// owner without a free worker is refused as busy once the caller's wait
// for a connection is over (WaitLeft), not after the owner's own bound.
func TestOwnerWaitsNoLongerThanTheCaller(t *testing.T) {
	u, owner, client := busyOwner(t, 4*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	w := &recordWaits{left: 100 * time.Millisecond}
	req, _ := http.NewRequestWithContext(WithWaitWatcher(ctx, w), "GET", u.url("/cl"), nil)
	start := time.Now()
	sendPastBusyOwner(t, owner, client, req, w)
	// The owner's own bound would have it refuse 4s in.
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("the request was answered %v in: the owner kept it past the caller's wait of %v", d, w.left)
	}
}

// TestRefusalThatSpendsTheWaitIsTheError: a watcher that ends the
// request's wait as it is told of an owner's refusal (its wait timeout
// passed while the owner kept the request) gets no retry: the request
// fails with the owner's refusal behind the context's error, so that the
// caller can tell a wait spent at a busy owner from one spent waiting for
// the pool.
func TestRefusalThatSpendsTheWaitIsTheError(t *testing.T) {
	u, owner, client := busyOwner(t, 100*time.Millisecond)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w := &recordWaits{retry: cancel}
	req, _ := http.NewRequestWithContext(WithWaitWatcher(ctx, w), "GET", u.url("/cl"), nil)
	resp, err := client.tr.RoundTrip(req)
	if err == nil {
		drain(resp)
		t.Fatalf("the request was served after its wait was spent (watcher told %q)", w.got())
	}
	if !errors.Is(err, ErrOwnerBusy) || !errors.Is(err, context.Canceled) {
		t.Errorf("error %v: want the owner's refusal (ErrOwnerBusy) behind context.Canceled", err)
	}
	if got := w.got(); got != "wrote retry-refused" {
		t.Errorf("watcher told %q, want \"wrote retry-refused\": no attempt after the wait was spent", got)
	}
	if n := owner.node.Stats().RefusedBy["busy"]; n != 1 {
		t.Errorf("the owner refused %d requests as busy, want 1", n)
	}
}

// TestOwnersWaitForAWorkerIsTheKeysWait: the time an owner held a
// sibling's request waiting for a worker is a wait for the connection, in
// the fleet's wait time for the key (wait_seconds_total), whether the owner
// then refused the request as busy or served it.
func TestOwnersWaitForAWorkerIsTheKeysWait(t *testing.T) {
	const ownerWait = 200 * time.Millisecond
	t.Run("refused", func(t *testing.T) {
		u, owner, client := busyOwner(t, ownerWait)
		req, _ := http.NewRequest("GET", u.url("/cl"), nil)
		start := time.Now()
		sendPastBusyOwner(t, owner, client, req, &recordWaits{})
		if got, elapsed := fleetWaitTime(t, owner), time.Since(start); got < ownerWait*3/4 || got > elapsed {
			t.Errorf("the fleet's wait time is %v after the owner kept the request %v and refused it; want that, and at most the request's %v", got, ownerWait, elapsed)
		}
	})
	for _, proto := range []string{"http1", "h2c"} {
		t.Run("served/"+proto, func(t *testing.T) { ownersWaitServed(t, proto, ownerWait) })
	}
}

// releaseAfter takes a worker of gov and gives it back d later, or when the
// test ends.
func releaseAfter(t *testing.T, gov *governor.Governor, d time.Duration) {
	held := gov.Acquire()
	free := time.AfterFunc(d, held.Release)
	t.Cleanup(func() {
		if free.Stop() {
			held.Release()
		}
	})
}

// fleetWaitTime is the fleet's wait time over every key.
func fleetWaitTime(t *testing.T, m *member) time.Duration {
	t.Helper()
	snap, err := m.pool.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	var d time.Duration
	for _, k := range snap.Keys {
		d += k.WaitTime
	}
	return d
}

// ownersWaitServed: an owner whose one worker comes free ownerWait after a
// sibling's request came serves it, counts that time as the key's wait, and
// tells the caller's watcher of it with its accept; a request it serves
// with a worker free at once tells of no wait.
func ownersWaitServed(t *testing.T, proto string, ownerWait time.Duration) {
	url := newTestUpstream(t).url("/cl")
	conf := func(tr *Transport) { tr.MaxConnsPerKey = 1 }
	if proto == "h2c" {
		url = newH2CServer(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }).url
		conf = func(tr *Transport) { h2cConf(tr); tr.MaxConnsPerKey = 1 }
	}
	gov := governor.New(1, 0)
	owner, client := budgetFleet(t, NodeOptions{Governor: gov, MaxLeaseWait: 5 * time.Second}, conf)
	warm(t, owner, url)
	releaseAfter(t, gov, ownerWait)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	w := &recordWaits{}
	req, _ := http.NewRequestWithContext(WithWaitWatcher(ctx, w), "GET", url, nil)
	start := time.Now()
	resp, err := client.tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	drain(resp)
	elapsed := time.Since(start)
	if s := owner.node.Stats(); s.ServedRemote != 1 {
		t.Fatalf("the owner served %d of the sibling's requests, want 1 (setup): %+v", s.ServedRemote, s)
	}
	if got := fleetWaitTime(t, owner); got < ownerWait*3/4 || got > elapsed {
		t.Errorf("the fleet's wait time is %v after the owner kept the request about %v for a worker; want that, and at most the request's %v", got, ownerWait, elapsed)
	}
	if got := w.ownerWait(); got < ownerWait*3/4 || got > elapsed {
		t.Errorf("the watcher was told the owner waited %v, after it kept the request about %v for a worker; want that, and at most the request's %v", got, ownerWait, elapsed)
	}

	// The worker is free now: the next request through the sibling waits
	// for none, and the accept tells of no wait.
	w = &recordWaits{}
	req, _ = http.NewRequestWithContext(WithWaitWatcher(ctx, w), "GET", url, nil)
	if resp, err = client.tr.RoundTrip(req); err != nil {
		t.Fatal(err)
	}
	drain(resp)
	if s := owner.node.Stats(); s.ServedRemote != 2 {
		t.Fatalf("the owner served %d of the sibling's requests, want 2 (setup): %+v", s.ServedRemote, s)
	}
	if got := w.ownerWait(); got != 0 {
		t.Errorf("the watcher was told the owner waited %v for a worker that was free", got)
	}
}

// TestRetryAfterAConnectionClosedUnansweredIsNoRefusal: a GET on a reused
// connection that its upstream closes once it has read the request is sent
// again on a new one; the time the closed connection took was no wait for
// a connection, and the watcher is not told the attempt was refused.
func TestRetryAfterAConnectionClosedUnansweredIsNoRefusal(t *testing.T) {
	var mu sync.Mutex
	answered := map[net.Conn]bool{}
	url := rawUpstream(t, func(c net.Conn, _ *bufio.Reader, req *http.Request) bool {
		mu.Lock()
		defer mu.Unlock()
		if answered[c] { // the second request on a connection: read and dropped
			c.Close()
			return false
		}
		answered[c] = true
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		return true
	}) + "/"
	m := localTransportMember(t, nil)
	warm(t, m, url)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	w := &recordWaits{}
	req, _ := http.NewRequestWithContext(WithWaitWatcher(ctx, w), "GET", url, nil)
	resp, err := m.tr.RoundTrip(req)
	if err != nil {
		t.Fatalf("%v (watcher told %q)", err, w.got())
	}
	drain(resp)
	if got := w.got(); got != "wrote retry wrote" {
		t.Errorf("watcher told %q, want \"wrote retry wrote\"", got)
	}
}

// TestPanickingWatcherLeavesNoConnectionTaken: a watcher that panics when a
// request written whole is out fails that request with an error, as a
// panic in a streamed body's writer does, and its connection is not left
// taken: with one connection for the key, the next request is served.
func TestPanickingWatcherLeavesNoConnectionTaken(t *testing.T) {
	u := newTestUpstream(t)
	m := localTransportMember(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(WithWaitWatcher(ctx, panicWaits{}), "GET", u.url("/cl"), nil)
	if resp, err := m.tr.RoundTrip(req); err == nil {
		drain(resp)
		t.Fatal("a request whose watcher panicked succeeded")
	}
	req, _ = http.NewRequestWithContext(ctx, "GET", u.url("/cl"), nil)
	resp, err := m.tr.RoundTrip(req)
	if err != nil {
		t.Fatalf("the request after a panicking watcher: %v (stats %+v)", err, m.node.Stats())
	}
	drain(resp)
}

type panicWaits struct{}

func (panicWaits) WroteHeaders()             { panic("watcher") }
func (panicWaits) Retrying(bool)             {}
func (panicWaits) WaitLeft() time.Duration   { return 0 }
func (panicWaits) OwnerWaited(time.Duration) {}

// TestRefusedUnserved: the attempts whose time after the head counts as
// waiting for a connection (WaitWatcher.Retrying's refused) are those
// refused before any work upstream, by a sibling or by an HTTP/2
// connection going away.
func TestRefusedUnserved(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"owner busy", &Error{Op: "lease", RetrySafe: true, beforeAccept: true, Err: fmt.Errorf("%w: %w: x", ErrLeaseRefused, ErrOwnerBusy)}, true},
		{"owner leaving", &Error{Op: "lease", RetrySafe: true, beforeAccept: true, Err: fmt.Errorf("%w: %w", ErrLeaseRefused, errOwnerLeaving)}, true},
		{"stream refused as the connection went away", fmt.Errorf("attempt: %w", &Error{Op: "roundtrip", RetrySafe: true, connGone: true, Err: ErrConnBroken}), true},
		{"reused connection closed unanswered", &Error{Op: "read", RetrySafe: true, Err: ErrConnBroken}, false},
		{"owner failed before its accept", &Error{Op: "read", RetrySafe: true, beforeAccept: true, Err: fmt.Errorf("%w: x", ErrOwnerFailed)}, false},
		{"dial", &Error{Op: "dial", RetrySafe: true, Err: io.EOF}, false},
	} {
		if got := refusedUnserved(tc.err); got != tc.want {
			t.Errorf("%s: refusedUnserved = %v, want %v", tc.name, got, tc.want)
		}
	}
}
