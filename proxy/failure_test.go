package proxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/orbitpool"
)

// paths runs f on the local path and on the remote path, warming the owner
// first so that the remote path really is remote.
func paths(t *testing.T, conf func(*Transport), f func(t *testing.T, rt http.RoundTripper, owner *member, before func() http.RoundTripper)) {
	t.Run("local", func(t *testing.T) {
		m := newMember(t, orbitpool.PoolSpec{Lanes: 1, Keys: 32, ResourcesPerLane: 128}, conf)
		f(t, m.tr, m, func() http.RoundTripper { return m.tr })
	})
	t.Run("remote", func(t *testing.T) {
		owner, client := remotePair(t, conf)
		f(t, client.tr, owner, func() http.RoundTripper { return owner.tr })
	})
}

func get(t *testing.T, ctx context.Context, rt http.RoundTripper, url string) (*http.Response, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, "GET", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	return rt.RoundTrip(req)
}

func TestStalledUpstreamEndsAtDeadline(t *testing.T) {
	u := newTestUpstream(t)
	paths(t, nil, func(t *testing.T, rt http.RoundTripper, owner *member, _ func() http.RoundTripper) {
		for _, tc := range []struct{ name, url, warm string }{
			{"before-head", u.rawURL("/stall-head"), u.rawURL("/reason")},
			{"mid-body", u.url("/stall"), u.url("/cl")},
		} {
			warm(t, owner, tc.warm)
			ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
			start := time.Now()
			resp, err := get(t, ctx, rt, tc.url)
			if err == nil {
				_, err = io.ReadAll(resp.Body)
				resp.Body.Close()
			}
			cancel()
			took := time.Since(start)
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("%s: error %v, want deadline exceeded", tc.name, err)
			}
			if took > 400*time.Millisecond {
				t.Errorf("%s: took %v past a 150ms deadline", tc.name, took)
			}
		}
	})
}

func TestCancelWhileWaitingForHead(t *testing.T) {
	u := newTestUpstream(t)
	paths(t, nil, func(t *testing.T, rt http.RoundTripper, owner *member, _ func() http.RoundTripper) {
		warm(t, owner, u.rawURL("/reason"))
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(50*time.Millisecond, cancel)
		start := time.Now()
		_, err := get(t, ctx, rt, u.rawURL("/stall-head"))
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("error %v, want context.Canceled", err)
		}
		if took := time.Since(start); took > 300*time.Millisecond {
			t.Fatalf("cancel took %v", took)
		}
		// The owner notices its peer leaving and frees the upstream
		// connection rather than holding it until the upstream answers.
		waitFor(t, 500*time.Millisecond, "the cancelled exchange's connection to be closed", func() bool {
			return owner.node.Stats().OpenConns == 0
		})
	})
}

func TestUpstreamClosingMidResponseDropsConn(t *testing.T) {
	u := newTestUpstream(t)
	paths(t, nil, func(t *testing.T, rt http.RoundTripper, owner *member, _ func() http.RoundTripper) {
		warm(t, owner, u.rawURL("/reason"))
		resp, err := get(t, context.Background(), rt, u.rawURL("/truncated"))
		if err != nil {
			t.Fatal(err)
		}
		_, err = io.ReadAll(resp.Body)
		resp.Body.Close()
		if !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, ErrConnBroken) {
			t.Fatalf("body error %v", err)
		}
		waitFor(t, 2*time.Second, "the broken connection to leave the pool", func() bool {
			return owner.node.Stats().OpenConns == 0
		})
	})
}

func TestIdleConnClosedByUpstreamIsNoticed(t *testing.T) {
	u := newTestUpstream(t)
	m := newMember(t, orbitpool.PoolSpec{Lanes: 1, Keys: 32, ResourcesPerLane: 128}, nil)
	resp, err := get(t, context.Background(), m.tr, u.rawURL("/keepalive-then-close"))
	if err != nil {
		t.Fatal(err)
	}
	drain(resp)
	if n := m.node.Stats().OpenConns; n != 1 {
		t.Fatalf("OpenConns %d after a keep-alive response", n)
	}
	// The upstream closes 20ms later; the sweep (50ms) must notice it
	// without any request touching the connection.
	waitFor(t, 2*time.Second, "the idle sweep to retire the closed connection", func() bool {
		return m.node.Stats().OpenConns == 0
	})
	snap, err := m.pool.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range snap.Keys {
		if k.Live != 0 {
			t.Errorf("key %v still has %d live resources", k.Key, k.Live)
		}
	}
}

func TestRetryReplayableOnIdleClosedConn(t *testing.T) {
	u := newTestUpstream(t)
	paths(t, func(tr *Transport) { tr.MaxConnsPerKey = 1 }, func(t *testing.T, rt http.RoundTripper, owner *member, _ func() http.RoundTripper) {
		warm(t, owner, u.rawURL("/once-per-conn"))
		// The connection is idle and alive; the upstream closes it when the
		// next request arrives, before answering. A GET goes again.
		retries := rt.(*Transport).Node.Stats().Retries
		resp, err := get(t, context.Background(), rt, u.rawURL("/once-per-conn"))
		if err != nil {
			t.Fatalf("replayable GET: %v", err)
		}
		drain(resp)
		if rt.(*Transport).Node.Stats().Retries != retries+1 {
			t.Fatalf("the GET was not retried once")
		}

		// A POST whose body cannot be replayed must not go again.
		warm(t, owner, u.rawURL("/once-per-conn"))
		req, _ := http.NewRequest("POST", u.rawURL("/once-per-conn"), io.NopCloser(strings.NewReader("x")))
		req.ContentLength = 1
		_, err = rt.RoundTrip(req)
		if err == nil {
			t.Fatal("non-replayable POST was sent again")
		}
		if IsRetrySafe(err) {
			t.Errorf("POST error %v claims retry safety after the request was written", err)
		}
	})
}

func TestWaitForCapacityUntilDeadline(t *testing.T) {
	u := newTestUpstream(t)
	tr := localTransport(t, func(tr *Transport) { tr.MaxConnsPerKey = 1 })
	// Hold the only connection with a stalled response.
	hold, cancelHold := context.WithCancel(context.Background())
	resp, err := get(t, hold, tr, u.url("/stall"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = get(t, ctx, tr, u.url("/cl"))
	if !errors.Is(err, ErrNoCapacity) || !IsRetrySafe(err) {
		t.Fatalf("error %v, want a retry-safe ErrNoCapacity", err)
	}
	if took := time.Since(start); took < 90*time.Millisecond || took > 400*time.Millisecond {
		t.Errorf("waited %v for a 100ms deadline", took)
	}
	// A waiter gets the connection as soon as it is freed.
	done := make(chan error, 1)
	go func() {
		resp, err := get(t, context.Background(), tr, u.url("/cl"))
		if err == nil {
			drain(resp)
		}
		done <- err
	}()
	time.Sleep(20 * time.Millisecond)
	cancelHold()
	resp.Body.Close()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("waiter not woken when capacity returned")
	}
}

func TestMaxRequestsPerConn(t *testing.T) {
	u := newTestUpstream(t)
	m := newMember(t, orbitpool.PoolSpec{Lanes: 1, Keys: 32, ResourcesPerLane: 128}, func(tr *Transport) { tr.MaxRequestsPerConn = 2 })
	for range 4 {
		resp, err := get(t, context.Background(), m.tr, u.url("/cl"))
		if err != nil {
			t.Fatal(err)
		}
		drain(resp)
	}
	if s := m.node.Stats(); s.Created != 2 || s.ReusedLocal != 2 {
		t.Fatalf("created %d reused %d, want 2 and 2", s.Created, s.ReusedLocal)
	}
}

func TestUpgradeLeavesPool(t *testing.T) {
	u := newTestUpstream(t)
	paths(t, nil, func(t *testing.T, rt http.RoundTripper, owner *member, _ func() http.RoundTripper) {
		warm(t, owner, u.url("/cl"))
		req, _ := http.NewRequest("GET", u.url("/upgrade"), nil)
		req.Header.Set("Upgrade", "echo")
		req.Header.Set("Connection", "Upgrade")
		resp, err := rt.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != 101 {
			t.Fatalf("status %d", resp.StatusCode)
		}
		waitFor(t, time.Second, "the upgraded connection to leave the pool", func() bool {
			return owner.node.Stats().OpenConns == 0
		})
		rw := resp.Body.(io.ReadWriter)
		io.WriteString(rw, "x")
		resp.Body.(interface{ CloseWrite() error }).CloseWrite()
		b, _ := io.ReadAll(rw)
		resp.Body.Close()
		if string(b) != "x|bye" {
			t.Fatalf("tunnel gave %q", b)
		}
	})
}

func TestTLSSessionResumption(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "tls") }))
	defer srv.Close()
	pool := x509.NewCertPool()
	pool.AddCert(srv.Certificate())
	tr := localTransport(t, func(tr *Transport) { tr.TLSClientConfig = &tls.Config{RootCAs: pool} })
	var resumed []bool
	for range 2 {
		resp, err := get(t, context.Background(), tr, srv.URL+"/")
		if err != nil {
			t.Fatal(err)
		}
		drain(resp)
		if resp.TLS == nil {
			t.Fatal("no TLS state on an https response")
		}
		resumed = append(resumed, resp.TLS.DidResume)
		tr.CloseIdleConnections()
	}
	if resumed[0] || !resumed[1] {
		t.Fatalf("DidResume %v, want [false true]", resumed)
	}
}

func TestLeaseRefusedIsTypedAndRetrySafe(t *testing.T) {
	u := newTestUpstream(t)
	owner, client := remotePair(t, nil)
	warm(t, owner, u.url("/cl"))
	// A well-formed lease that nobody reserved.
	bogus := orbitpool.Lease{ID: 1<<36 | 5, Owner: owner.pool.Incarnation(), Ticket: 99, Bit: 0}
	req, _ := http.NewRequest("GET", u.url("/cl"), nil)
	client.tr.initOnce.Do(client.tr.init)
	_, err := client.node.peers.roundTrip(req, owner.pool.Lane(), bogus, &client.tr.remote, 1, nil)
	if !errors.Is(err, ErrLeaseRefused) || !IsRetrySafe(err) {
		t.Fatalf("error %v, want retry-safe ErrLeaseRefused", err)
	}
}

func TestMalformedFrameClosesOnlyThatStream(t *testing.T) {
	u := newTestUpstream(t)
	owner, client := remotePair(t, nil)
	path := SocketPath(SocketDir(owner.pool.Spec().Path), owner.pool.Lane())
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("socket mode %v", fi.Mode().Perm())
	}
	di, _ := os.Stat(filepath.Dir(path))
	if di.Mode().Perm() != 0o700 {
		t.Errorf("socket dir mode %v", di.Mode().Perm())
	}

	// A stream that is in the middle of a streamed response.
	warm(t, owner, u.url("/cl"))
	resp, err := get(t, context.Background(), client.tr, u.url("/stream?id=malformed"))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if _, err := readWithTimeout(resp.Body, len("chunk-0;"), 2*time.Second); err != nil {
		t.Fatal(err)
	}

	var wg sync.WaitGroup
	for _, junk := range []string{"GET / HTTP/1.1\r\n\r\n", "OR\x01\x01\x00\x00\x00\x00", "OR\x09garbage and more garbage"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := net.Dial("unix", path)
			if err != nil {
				t.Error(err)
				return
			}
			defer c.Close()
			io.WriteString(c, junk)
			if junk == "OR\x01\x01\x00\x00\x00\x00" {
				c.(*net.UnixConn).CloseWrite()
			}
			c.SetReadDeadline(time.Now().Add(2 * time.Second))
			b, err := io.ReadAll(bufio.NewReader(c))
			if err != nil {
				t.Errorf("owner did not close a stream sending %q: %v", junk, err)
			}
			if len(b) != 0 {
				t.Errorf("owner answered junk with %q", b)
			}
		}()
	}
	wg.Wait()
	// The other stream is unaffected.
	u.gate("malformed") <- struct{}{}
	u.gate("malformed") <- struct{}{}
	rest, err := io.ReadAll(resp.Body)
	if err != nil || string(rest) != "chunk-1;chunk-2;" {
		t.Fatalf("stream after junk: %q %v", rest, err)
	}
}

func TestOwnerClosedMidStreamErrorsFast(t *testing.T) {
	u := newTestUpstream(t)
	owner, client := remotePair(t, nil)
	warm(t, owner, u.url("/cl"))
	resp, err := get(t, context.Background(), client.tr, u.url("/stream?id=ownergone"))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if _, err := readWithTimeout(resp.Body, len("chunk-0;"), 2*time.Second); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	go owner.node.Close()
	_, err = readWithTimeout(resp.Body, 1, time.Second)
	if err == nil {
		t.Fatal("read after the owner went succeeded")
	}
	if took := time.Since(start); took > 100*time.Millisecond {
		t.Fatalf("error after %v", took)
	}
	u.gate("ownergone") <- struct{}{}
	u.gate("ownergone") <- struct{}{}
}

// TestOwnerKilledBeforeAnswerRetriesReplayable: the owner process dies (its
// streams close without a word) after it took up a sibling's request and
// before the upstream answered. The upstream connection behind the stream
// was a reused one, lost before any byte of the answer: net/http sends a
// replayable request again then, and so does the sibling, on a connection of
// its own once the dead owner's lane is gone, so its client sees no error. A
// POST may have reached the upstream, and is not sent again.
func TestOwnerKilledBeforeAnswerRetriesReplayable(t *testing.T) {
	for _, method := range []string{"GET", "POST"} {
		t.Run(method, func(t *testing.T) {
			var first atomic.Bool
			arrived, release := make(chan struct{}), make(chan struct{})
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == "/hang" && first.CompareAndSwap(false, true) {
					close(arrived)
					select {
					case <-release:
					case <-r.Context().Done():
					}
					return
				}
				io.WriteString(w, "answered "+r.URL.Path)
			}))
			defer srv.Close()
			defer close(release)
			owner, client := remotePair(t, nil)
			warm(t, owner, srv.URL+"/warm")

			done := roundTripAsync(client.tr, method, srv.URL+"/hang", strings.NewReader("payload"))
			select {
			case <-arrived:
			case <-time.After(10 * time.Second):
				t.Fatal("the sibling's request never reached the upstream")
			}
			owner.dieAsKilled()

			r := <-done
			st := client.node.Stats()
			if method == "POST" {
				if !errors.Is(r.err, ErrOwnerGone) || st.Retries != 0 {
					t.Fatalf("the POST ended with %q, %v after %d retries: want ErrOwnerGone and none", r.body, r.err, st.Retries)
				}
				return
			}
			if r.err != nil || r.body != "answered /hang" {
				t.Fatalf("the GET ended with %q, %v", r.body, r.err)
			}
			if st.ReusedRemote != 1 || st.Retries != 1 || st.Created != 1 {
				t.Fatalf("want one request through the owner, then one retry on a connection of the sibling's own: %+v", st)
			}
		})
	}
}

// TestOwnerKilledMidWriteIsReplayable: a write to a killed owner's stream
// (the head, or the final flush) fails (EPIPE, ECONNRESET) after part of the
// request went out, which a killed worker under load causes. Like a read that finds the stream gone,
// it may send a replayable request again; on the upstream leg, a broken
// write with bytes out stays what net/http makes of it, not retried.
func TestOwnerKilledMidWriteIsReplayable(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	for _, tc := range []struct {
		name       string
		leg        leg
		replayable bool
	}{
		{"unix leg", &remoteLeg{}, true},
		{"upstream leg", nil, false},
	} {
		x := &exchange{c: newConn(a, a), o: &exchangeOpts{leg: tc.leg}}
		x.c.cw.n.Add(10) // part of the request went out
		x.c.cw.failed.Store(true)
		err := x.writeError(&net.OpError{Op: "write", Net: "unix", Err: syscall.EPIPE})
		var pe *Error
		if !errors.As(err, &pe) || pe.RetrySafe || pe.idleClosed != tc.replayable ||
			errors.Is(err, ErrOwnerGone) != tc.replayable {
			t.Errorf("%s: %v classified as retry-safe %v, replayable %v", tc.name, err, pe.RetrySafe, pe.idleClosed)
		}
	}
}

// stallWriter holds each Write until release, then fails it with nothing
// written, as a peer that died meanwhile does.
type stallWriter struct{ entered, release chan struct{} }

func (w stallWriter) Write([]byte) (int, error) {
	close(w.entered)
	<-w.release
	return 0, syscall.EPIPE
}

// TestWriteUnderWayCountsAsWritten: bytes being written may reach the peer
// before the write returns, and a reader that finds the peer gone meanwhile
// must not take them for nothing written (a POST would be sent again). A
// write that failed having sent nothing leaves the count as it was.
func TestWriteUnderWayCountsAsWritten(t *testing.T) {
	w := stallWriter{make(chan struct{}), make(chan struct{})}
	cw := &countWriter{w: w}
	head := []byte("POST / HTTP/1.1\r\n")
	done := make(chan struct{})
	go func() {
		defer close(done)
		cw.Write(head)
	}()
	<-w.entered
	if got := cw.n.Load(); got != int64(len(head)) {
		t.Errorf("%d bytes counted while a write of %d is under way", got, len(head))
	}
	close(w.release)
	<-done
	if got := cw.n.Load(); got != 0 {
		t.Errorf("%d bytes counted after a write that sent none", got)
	}
}

func TestTLSUpstreamRemotePath(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Trailer", "X-T")
		io.WriteString(w, "tls "+r.URL.Path)
		w.Header().Set("X-T", "done")
	}))
	defer srv.Close()
	pool := x509.NewCertPool()
	pool.AddCert(srv.Certificate())
	owner, client := remotePair(t, func(tr *Transport) { tr.TLSClientConfig = &tls.Config{RootCAs: pool} })
	warm(t, owner, srv.URL+"/warm")
	resp, err := get(t, context.Background(), client.tr, srv.URL+"/remote")
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || string(b) != "tls /remote" || resp.Trailer.Get("X-T") != "done" {
		t.Fatalf("body %q trailer %v err %v", b, resp.Trailer, err)
	}
	if client.node.Stats().ReusedRemote != 1 || client.node.Stats().Created != 0 {
		t.Fatalf("not served remotely: %+v", client.node.Stats())
	}
}

// TestStaleStreamToGoneOwnerIsRetrySafe: an idle stream to an owner that has
// since gone fails before anything is sent, so the request may go elsewhere.
func TestStaleStreamToGoneOwnerIsRetrySafe(t *testing.T) {
	u := newTestUpstream(t)
	owner, client := pairWithIdleStream(t, u)
	owner.node.Close()
	time.Sleep(10 * time.Millisecond)
	lease := orbitpool.Lease{ID: 1<<36 | 5, Owner: owner.pool.Incarnation(), Ticket: 99}
	req, _ := http.NewRequest("POST", u.url("/sink"), strings.NewReader("not replayable by method"))
	_, err := client.node.peers.roundTrip(req, owner.pool.Lane(), lease, &client.tr.remote, 1, nil)
	if err == nil {
		t.Fatal("request through a closed owner succeeded")
	}
	// A POST is not replayable: an idle close alone would not let it go
	// elsewhere, so nothing having been sent must make it retry-safe.
	var pe *Error
	if !errors.As(err, &pe) || !pe.RetrySafe {
		t.Fatalf("error %v is not retry-safe", err)
	}
	t.Logf("error: %v (retry-safe %v)", err, pe.RetrySafe)
}

// TestOwnerShutdownFailsNoSiblingRequest: an owner that shuts down lets the
// exchange a sibling has under way on its connection finish, and a sibling's
// request that arrives meanwhile is served anyway (refused by the owner,
// then retried on a plan of its own), whatever its method.
func TestOwnerShutdownFailsNoSiblingRequest(t *testing.T) {
	u := newTestUpstream(t)
	// Room for a second connection, for the request that comes while the
	// first is busy with the exchange under way.
	owner, client := remotePair(t, func(tr *Transport) { tr.MaxConnsPerKey = 2 })
	warm(t, owner, u.url("/cl"))
	resp, err := get(t, context.Background(), client.tr, u.url("/stream?id=shutdown"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := readWithTimeout(resp.Body, len("chunk-0;"), 2*time.Second); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		done <- owner.node.Shutdown(ctx)
	}()
	// The owner is draining: a new request through it must still succeed.
	waitFor(t, 2*time.Second, "the owner to drain", func() bool { return owner.node.draining.Load() })
	// A body a server hands on, with no GetBody to send it again.
	req, _ := http.NewRequest("POST", u.url("/echo"), io.NopCloser(strings.NewReader("while draining")))
	req.ContentLength = int64(len("while draining"))
	r2, err := client.tr.RoundTrip(req)
	if err != nil {
		t.Fatalf("a request while the owner drains: %v", err)
	}
	b, _ := io.ReadAll(r2.Body)
	r2.Body.Close()
	if r2.StatusCode != 200 || !strings.Contains(string(b), "while draining") {
		t.Fatalf("a request while the owner drains: %d %q", r2.StatusCode, b)
	}
	select {
	case err := <-done:
		t.Fatalf("Shutdown returned (%v) while a sibling's exchange was under way", err)
	case <-time.After(100 * time.Millisecond):
	}
	u.gate("shutdown") <- struct{}{}
	u.gate("shutdown") <- struct{}{}
	rest, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || !strings.Contains(string(rest), "chunk-2") {
		t.Fatalf("the exchange under way when the owner began to leave: %q, %v", rest, err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Shutdown did not return once the exchange ended")
	}
}

// TestLoweredCapRetiresConnections: a Transport configured with a lower cap
// than the connections the fleet holds (a reload lowered it) gets the idle
// ones above it retired by the next sweep, and a busy one when it comes back.
func TestLoweredCapRetiresConnections(t *testing.T) {
	u := newTestUpstream(t)
	m := newFleet(t, 1, func(tr *Transport) { tr.MaxConnsPerKey = 4 })[0]
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			resp, err := get(t, context.Background(), m.tr, u.url("/slow?ms=200"))
			if err != nil {
				t.Error(err)
				return
			}
			drain(resp)
		})
	}
	wg.Wait()
	_, key, err := m.tr.Upstream(mustRequest(t, u.url("/cl")))
	if err != nil {
		t.Fatal(err)
	}
	if live := m.pool.Live(key); live != 4 {
		t.Fatalf("%d connections after 4 concurrent requests under a cap of 4", live)
	}
	lowered := &Transport{Node: m.node, MaxConnsPerKey: 2}
	resp, err := get(t, context.Background(), lowered, u.url("/cl"))
	if err != nil {
		t.Fatal(err)
	}
	drain(resp)
	waitFor(t, 3*time.Second, "the connections above the lowered cap to be retired", func() bool { return m.pool.Live(key) <= 2 })
}

func mustRequest(t *testing.T, url string) *http.Request {
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	return req
}

// TestSiblingGoneMidRequestBody: a sibling that goes away in the middle of a
// request body ends the owner's exchange at once, and the upstream
// connection, which saw only part of the body, is closed rather than reused.
func TestSiblingGoneMidRequestBody(t *testing.T) {
	got := make(chan int64, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/sink" {
			io.WriteString(w, "ok")
			return
		}
		n, _ := io.Copy(io.Discard, r.Body)
		got <- n
	}))
	defer srv.Close()
	owner, client := remotePair(t, nil)
	warm(t, owner, srv.URL+"/warm")
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	req, _ := http.NewRequestWithContext(ctx, "POST", srv.URL+"/sink", pr)
	req.ContentLength = 1 << 20
	errc := make(chan error, 1)
	go func() {
		resp, err := client.tr.RoundTrip(req)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	pw.Write(make([]byte, 200<<10))
	cancel()
	pw.CloseWithError(errors.New("client gone"))
	if err := <-errc; err == nil {
		t.Fatal("a request whose body was cut short succeeded")
	}
	select {
	case n := <-got:
		if n >= 1<<20 {
			t.Fatalf("upstream read %d bytes of a body cut short", n)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the upstream still waits for the rest of the body: the owner did not end the exchange")
	}
	waitFor(t, 2*time.Second, "the upstream connection to close", func() bool {
		return owner.node.Stats().OpenConns == 0
	})
}
