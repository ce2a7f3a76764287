package proxy

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/orbitpool"
	"golang.org/x/net/http2"
)

// siblingLease takes a lease on the owner's connection for key through
// client's pool, as a sibling's request would, for a test that speaks the
// unix leg itself.
func siblingLease(t testing.TB, client *member, key orbitpool.Key, maxConns int) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	plan, err := client.pool.Acquire(ctx, key, orbitpool.LocalFirst{}, orbitpool.Limits{MaxResources: maxConns})
	if err != nil || plan.Kind != orbitpool.PlanReuseRemote {
		t.Fatalf("plan %+v %v, want a lease on the owner's connection", plan, err)
	}
	lb, _ := plan.Lease.AppendBinary(nil)
	return lb
}

// dialOwner opens a unix stream to the owner, closed when t ends.
func dialOwner(t testing.TB, owner *member) net.Conn {
	t.Helper()
	sc, err := net.Dial("unix", SocketPath(SocketDir(owner.pool.Spec().Path), owner.pool.Lane()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sc.Close() })
	return sc
}

// leasedStream is a stream to the owner and the request frame (with
// flagBodyOnAccept and deadline) of a lease on its connection for key.
func leasedStream(t testing.TB, owner, client *member, key orbitpool.Key, maxConns int, deadline time.Time) (net.Conn, []byte) {
	t.Helper()
	frame, err := appendRequestFrame(nil, siblingLease(t, client, key, maxConns), deadline, flagBodyOnAccept)
	if err != nil {
		t.Fatal(err)
	}
	return dialOwner(t, owner), frame
}

// closeIdleUntilGone closes the members' idle connections until none of
// key's is live in the pool, and fails t if one still is after within.
func closeIdleUntilGone(t *testing.T, key orbitpool.Key, within time.Duration, ms ...*member) {
	t.Helper()
	for end := time.Now().Add(within); ms[0].pool.Live(key) != 0 && time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		for _, m := range ms {
			m.tr.CloseIdleConnections()
		}
	}
	if n := ms[0].pool.Live(key); n != 0 {
		cs, _ := ms[0].pool.Candidates(key, nil)
		t.Errorf("%d connections still live after CloseIdleConnections with nothing running: %+v", n, cs)
	}
}

// zeros is an endless request body.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// serveH2Frames is a bare HTTP/2 server on c: it reads the client preface,
// sends settings and a connection window of 1 GiB, answers SETTINGS and
// PING, and hands the first request's HEADERS to onHeaders, then returns.
// Tests use it to make an upstream misbehave at that point (answer, then
// stop reading; or stop reading at once).
func serveH2Frames(c net.Conn, settings []http2.Setting, onHeaders func(*http2.Framer, *http2.HeadersFrame)) {
	preface := make([]byte, len(http2.ClientPreface))
	if _, err := io.ReadFull(c, preface); err != nil {
		return
	}
	fr := http2.NewFramer(c, c)
	fr.WriteSettings(settings...)
	fr.WriteWindowUpdate(0, 1<<30)
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			return
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				fr.WriteSettingsAck()
			}
		case *http2.PingFrame:
			if !f.IsAck() {
				fr.WritePing(true, f.Data)
			}
		case *http2.HeadersFrame:
			onHeaders(fr, f)
			return
		}
	}
}

// member is one process's worth of fleet inside the test process: opening
// the segment again joins it as another lane, with its own Node and socket.
type member struct {
	pool *orbitpool.Pool
	node *Node
	tr   *Transport
}

var testSpec = orbitpool.PoolSpec{Lanes: 8, Keys: 32, ResourcesPerLane: 128}

// newFleet opens a shared segment in a temp dir and joins it n times.
func newFleet(t testing.TB, n int, conf func(*Transport)) []*member {
	t.Helper()
	spec := testSpec
	spec.Path = filepath.Join(t.TempDir(), "seg")
	var ms []*member
	for range n {
		ms = append(ms, newMember(t, spec, conf))
	}
	return ms
}

// observedSegment is a fresh segment's spec, and a pool on it that only
// looks (a process reading the table), closed as the test ends.
func observedSegment(t testing.TB) (orbitpool.PoolSpec, *orbitpool.Pool) {
	t.Helper()
	spec := testSpec
	spec.Path = filepath.Join(t.TempDir(), "seg")
	obs, err := orbitpool.Open(spec, orbitpool.Options{ReconcileInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { obs.Close() })
	return spec, obs
}

func newMember(t testing.TB, spec orbitpool.PoolSpec, conf func(*Transport)) *member {
	t.Helper()
	return newMemberOpts(t, spec, NodeOptions{SweepInterval: 50 * time.Millisecond}, conf)
}

func newMemberOpts(t testing.TB, spec orbitpool.PoolSpec, opts NodeOptions, conf func(*Transport)) *member {
	t.Helper()
	return newMemberPoolOpts(t, spec, orbitpool.Options{ReconcileInterval: 50 * time.Millisecond}, opts, conf)
}

func newMemberPoolOpts(t testing.TB, spec orbitpool.PoolSpec, popts orbitpool.Options, opts NodeOptions, conf func(*Transport)) *member {
	t.Helper()
	p, err := orbitpool.Open(spec, popts)
	if err != nil {
		t.Fatal(err)
	}
	nd, err := NewNode(p, opts)
	if err != nil {
		p.Close()
		t.Fatal(err)
	}
	tr := &Transport{Node: nd}
	if conf != nil {
		conf(tr)
	}
	t.Cleanup(func() {
		nd.Close()
		p.Close()
	})
	return &member{pool: p, node: nd, tr: tr}
}

// leave closes m's node: at once ("close"), or draining first for at most
// 2s ("shutdown").
func (m *member) leave(how string) {
	if how == "close" {
		m.node.Close()
		return
	}
	ctx, cancel := contextWithTimeout(2 * time.Second)
	defer cancel()
	m.node.Shutdown(ctx)
}

// dieAsKilled ends m as a killed process ends: every stream to its server
// closes unannounced, then its lane leaves the table.
func (m *member) dieAsKilled() {
	m.node.srv.mu.Lock()
	for c := range m.node.srv.conns {
		c.Close()
	}
	m.node.srv.mu.Unlock()
	m.node.Close()
	m.pool.Close()
}

// localTransport is a Transport over a pool in process memory.
func localTransport(t testing.TB, conf func(*Transport)) *Transport {
	t.Helper()
	return newMember(t, orbitpool.PoolSpec{Lanes: 1, Keys: 32, ResourcesPerLane: 128}, conf).tr
}

// remotePair returns an owner and a client transport sharing a segment, with
// a budget of one connection per key: once the owner has made the connection
// (warm), every client request must use it remotely.
func remotePair(t testing.TB, conf func(*Transport)) (owner, client *member) {
	t.Helper()
	ms := newFleet(t, 2, func(tr *Transport) {
		tr.MaxConnsPerKey = 1
		if conf != nil {
			conf(tr)
		}
	})
	return ms[0], ms[1]
}

// discardUpstream is an upstream that reads each request's body and answers
// 200 with none, stopped when the test ends.
func discardUpstream(t testing.TB) *httptest.Server {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
	}))
	t.Cleanup(up.Close)
	return up
}

// warm makes owner create its connection to url.
func warm(t testing.TB, owner *member, url string) {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	resp, err := owner.tr.RoundTrip(req)
	if err != nil {
		t.Fatalf("warm: %v", err)
	}
	drain(resp)
}

func drain(resp *http.Response) {
	buf := make([]byte, 32<<10)
	for {
		if _, err := resp.Body.Read(buf); err != nil {
			break
		}
	}
	resp.Body.Close()
}

// waitFor polls cond until it holds or d passes.
func waitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// pairWithIdleStream is remotePair (one connection per key) after one
// request through the owner, which leaves the client one idle stream to it.
func pairWithIdleStream(t *testing.T, u *testUpstream) (owner, client *member) {
	t.Helper()
	owner, client = remotePair(t, nil)
	warm(t, owner, u.url("/cl"))
	resp, err := get(t, context.Background(), client.tr, u.url("/cl"))
	if err != nil {
		t.Fatal(err)
	}
	drain(resp)
	if client.node.Stats().IdlePeerConns != 1 {
		t.Fatalf("no idle stream kept: %+v", client.node.Stats())
	}
	return owner, client
}

// idleStreamTo is client's one idle stream to owner.
func idleStreamTo(t *testing.T, client, owner *member) *conn {
	t.Helper()
	p := client.node.peers
	p.mu.Lock()
	defer p.mu.Unlock()
	idle := p.idle[owner.pool.Lane()]
	if len(idle) != 1 {
		t.Fatalf("%d idle streams to the owner, want 1", len(idle))
	}
	return idle[0]
}

// serveConns accepts on ln until the test ends and runs handle for each
// connection, numbered from 1 in the order accepted, in a goroutine of its
// own; the connection is closed when handle returns. At cleanup it closes
// ln and every connection still open, and waits for the handlers.
func serveConns(t testing.TB, ln net.Listener, handle func(c net.Conn, id int)) {
	t.Helper()
	var (
		mu   sync.Mutex
		open = map[net.Conn]bool{}
		wg   sync.WaitGroup
	)
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for c := range open {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for id := 1; ; id++ {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			open[c] = true
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() {
					c.Close()
					mu.Lock()
					delete(open, c)
					mu.Unlock()
				}()
				handle(c, id)
			}()
		}
	}()
}

// appendRequestFrame encodes a request frame without flagLength and
// flagWaitLeft.
func appendRequestFrame(b []byte, lease []byte, deadline time.Time, flags uint16) ([]byte, error) {
	return appendRequestFrameLength(b, lease, deadline, flags, -1)
}

// appendRequestFrameLength encodes a request frame without flagWaitLeft,
// with flagLength and length when length >= 0.
func appendRequestFrameLength(b []byte, lease []byte, deadline time.Time, flags uint16, length int64) ([]byte, error) {
	return appendRequestFrameWait(b, lease, deadline, flags, length, 0)
}
