package proxy

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/internal/grpcmsg"
	"github.com/orbitproxy/orbit/orbitpool"
)

// h2Upstream is an h2c test upstream (HTTP/2 with prior knowledge) that
// counts connections and concurrent streams, with gRPC-style handlers:
// messages are a 5-byte prefix (flag, big-endian length) and a payload.
type h2Upstream struct {
	ln    net.Listener
	hs    *http.Server
	url   string
	conns atomic.Int64
	cur   atomic.Int64
	peak  atomic.Int64
	wg    sync.WaitGroup
}

// newH2Upstream serves h2c with prior knowledge from net/http's own server,
// whose Shutdown sends GOAWAY on every connection. (x/net's ServeConn, built
// with Go 1.27, serves each connection from a copy of its BaseConfig, which
// the original's Shutdown does not reach.)
func newH2Upstream(t testing.TB, maxStreams uint32) *h2Upstream {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := &h2Upstream{ln: ln, url: "http://" + ln.Addr().String()}
	u.hs = &http.Server{
		Handler: http.HandlerFunc(u.serve),
		HTTP2:   &http.HTTP2Config{MaxConcurrentStreams: int(maxStreams)},
		ConnState: func(_ net.Conn, st http.ConnState) {
			if st == http.StateNew {
				u.conns.Add(1)
			}
		},
	}
	u.hs.Protocols = new(http.Protocols)
	u.hs.Protocols.SetUnencryptedHTTP2(true)
	u.wg.Add(1)
	go func() {
		defer u.wg.Done()
		u.hs.Serve(ln)
	}()
	t.Cleanup(u.close)
	return u
}

func (u *h2Upstream) close() {
	u.hs.Close()
	u.wg.Wait()
}

// goAway sends GOAWAY on every connection: streams in flight finish.
func (u *h2Upstream) goAway() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	u.hs.Shutdown(ctx)
}

// serve: /unary echoes one message; /echo echoes every message as it comes
// (bidi), /server answers N messages, /client sums what it got, /hold
// waits for the client to go away, /reset-trailer sends a trailer named
// like the unix leg's streamResetTrailer. Every response ends with grpc-status,
// and echoes a request trailer as x-got-trailer.
func (u *h2Upstream) serve(w http.ResponseWriter, r *http.Request) {
	n := u.cur.Add(1)
	defer u.cur.Add(-1)
	for {
		p := u.peak.Load()
		if n <= p || u.peak.CompareAndSwap(p, n) {
			break
		}
	}
	if r.ProtoMajor != 2 {
		http.Error(w, "want HTTP/2", http.StatusHTTPVersionNotSupported)
		return
	}
	w.Header().Set("Content-Type", "application/grpc")
	w.Header().Set("Trailer", "Grpc-Status")
	w.WriteHeader(http.StatusOK)
	fl := w.(http.Flusher)
	status := "0"
	switch r.URL.Path {
	case "/unary":
		grpcmsg.Echo(w, fl.Flush, r.Body, 1)
	case "/echo":
		grpcmsg.Echo(w, fl.Flush, r.Body, 0)
	case "/server":
		for i := range 5 {
			w.Write(grpcmsg.Frame([]byte(fmt.Sprintf("msg %d", i))))
			fl.Flush()
			time.Sleep(time.Millisecond)
		}
	case "/client":
		total := 0
		for {
			p, err := grpcmsg.Read(r.Body)
			if err != nil {
				break
			}
			total += len(p)
		}
		w.Write(grpcmsg.Frame([]byte(fmt.Sprint(total))))
	case "/hold":
		fl.Flush()
		<-r.Context().Done()
		return
	case "/len":
		io.Copy(io.Discard, r.Body)
		w.Write(grpcmsg.Frame([]byte(fmt.Sprint(r.ContentLength))))
	case "/slow":
		time.Sleep(50 * time.Millisecond)
		w.Write(grpcmsg.Frame([]byte("slow")))
	case "/reset-trailer":
		// A trailer of the unix leg's reserved name, undeclared.
		io.WriteString(w, "done")
		w.Header().Set(http.TrailerPrefix+streamResetTrailer, "1 2")
	default:
		status = "12"
	}
	io.Copy(io.Discard, r.Body)
	if v := r.Trailer.Get("X-Req-Trailer"); v != "" {
		w.Header().Set(http.TrailerPrefix+"X-Got-Trailer", v)
	}
	w.Header().Set("Grpc-Status", status)
}

func h2cConf(tr *Transport) { tr.H2C = true }

func grpcReq(t testing.TB, ctx context.Context, url string, body io.Reader) *http.Request {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, "POST", url, body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/grpc")
	req.Header.Set("Te", "trailers")
	return req
}

func TestH2CUnaryLocalAndRemote(t *testing.T) {
	up := newH2Upstream(t, 100)
	owner, client := remotePair(t, h2cConf)
	for i, m := range []*member{owner, client, owner, client} {
		req := grpcReq(t, context.Background(), up.url+"/unary", bytes.NewReader(grpcmsg.Frame([]byte("hello"))))
		resp, err := m.tr.RoundTrip(req)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		if resp.ProtoMajor != 2 || resp.StatusCode != 200 {
			t.Fatalf("request %d: %s %d, want HTTP/2.0 200", i, resp.Proto, resp.StatusCode)
		}
		p, err := grpcmsg.Read(resp.Body)
		if err != nil || string(p) != "hello" {
			t.Fatalf("request %d: message %q, %v", i, p, err)
		}
		if _, err := io.Copy(io.Discard, resp.Body); err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if got := resp.Trailer.Get("Grpc-Status"); got != "0" {
			t.Fatalf("request %d: grpc-status trailer %q, want 0 (trailer %v)", i, got, resp.Trailer)
		}
		if len(resp.TransferEncoding) != 0 || resp.ContentLength != -1 {
			t.Fatalf("request %d: TransferEncoding %v ContentLength %d, want none and -1 as net/http's HTTP/2", i, resp.TransferEncoding, resp.ContentLength)
		}
	}
	if got := up.conns.Load(); got != 1 {
		t.Fatalf("upstream saw %d connections, want 1 shared by both members", got)
	}
	if s := client.node.Stats(); s.ReusedRemote != 2 || s.Created != 0 {
		t.Fatalf("client stats %+v: want 2 remote uses and no connection of its own", s)
	}
}

// TestH2CBidiThroughSibling streams messages both ways at once through the
// owner: each message is answered before the next is sent, which only works
// when request and response bodies flow at the same time. A request trailer
// reaches the upstream, and grpc-status comes back.
func TestH2CBidiThroughSibling(t *testing.T) {
	up := newH2Upstream(t, 100)
	owner, client := remotePair(t, h2cConf)
	warmH2(t, owner, up.url)
	pr, pw := io.Pipe()
	req := grpcReq(t, context.Background(), up.url+"/echo", pr)
	req.Trailer = http.Header{"X-Req-Trailer": nil}
	type result struct {
		resp *http.Response
		err  error
	}
	got := make(chan result, 1)
	go func() {
		resp, err := client.tr.RoundTrip(req)
		got <- result{resp, err}
	}()
	if _, err := pw.Write(grpcmsg.Frame([]byte("m0"))); err != nil {
		t.Fatal(err)
	}
	var r result
	select {
	case r = <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("no response head while the request streams")
	}
	if r.err != nil {
		t.Fatal(r.err)
	}
	resp := r.resp
	defer resp.Body.Close()
	for i := range 20 {
		if i > 0 {
			if _, err := pw.Write(grpcmsg.Frame([]byte(fmt.Sprintf("m%d", i)))); err != nil {
				t.Fatal(err)
			}
		}
		p, err := grpcmsg.Read(resp.Body)
		if err != nil || string(p) != fmt.Sprintf("m%d", i) {
			t.Fatalf("message %d: %q, %v", i, p, err)
		}
	}
	req.Trailer.Set("X-Req-Trailer", "sent-last")
	pw.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		t.Fatal(err)
	}
	if resp.Trailer.Get("Grpc-Status") != "0" || resp.Trailer.Get("X-Got-Trailer") != "sent-last" {
		t.Fatalf("trailers %v: want grpc-status 0 and the request trailer echoed", resp.Trailer)
	}
	if client.node.Stats().ReusedRemote != 1 || up.conns.Load() != 1 {
		t.Fatalf("want the stream through the owner's one connection: %+v, %d conns", client.node.Stats(), up.conns.Load())
	}
}

func warmH2(t testing.TB, owner *member, url string) {
	t.Helper()
	resp, err := owner.tr.RoundTrip(grpcReq(t, context.Background(), url+"/unary", bytes.NewReader(grpcmsg.Frame([]byte("w")))))
	if err != nil {
		t.Fatalf("warm: %v", err)
	}
	drain(resp)
}

// TestH2CStreamingShapes runs server streaming, client streaming and a large
// message through a sibling.
func TestH2CStreamingShapes(t *testing.T) {
	up := newH2Upstream(t, 100)
	owner, client := remotePair(t, h2cConf)
	warmH2(t, owner, up.url)

	resp, err := client.tr.RoundTrip(grpcReq(t, context.Background(), up.url+"/server", http.NoBody))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		p, err := grpcmsg.Read(resp.Body)
		if err != nil || string(p) != fmt.Sprintf("msg %d", i) {
			t.Fatalf("server stream message %d: %q, %v", i, p, err)
		}
	}
	drain(resp)
	if resp.Trailer.Get("Grpc-Status") != "0" {
		t.Fatalf("server stream trailers %v", resp.Trailer)
	}

	var body bytes.Buffer
	for range 10 {
		body.Write(grpcmsg.Frame(bytes.Repeat([]byte("x"), 1000)))
	}
	resp, err = client.tr.RoundTrip(grpcReq(t, context.Background(), up.url+"/client", &body))
	if err != nil {
		t.Fatal(err)
	}
	if p, err := grpcmsg.Read(resp.Body); err != nil || string(p) != "10000" {
		t.Fatalf("client stream sum %q, %v", p, err)
	}
	drain(resp)

	big := bytes.Repeat([]byte("0123456789abcdef"), 4<<20/16) // 4 MiB, past every window
	resp, err = client.tr.RoundTrip(grpcReq(t, context.Background(), up.url+"/unary", bytes.NewReader(grpcmsg.Frame(big))))
	if err != nil {
		t.Fatal(err)
	}
	if p, err := grpcmsg.Read(resp.Body); err != nil || !bytes.Equal(p, big) {
		t.Fatalf("large message: %d bytes back, %v", len(p), err)
	}
	drain(resp)
	if resp.Trailer.Get("Grpc-Status") != "0" {
		t.Fatalf("large message trailers %v", resp.Trailer)
	}
	if up.conns.Load() != 1 {
		t.Fatalf("upstream saw %d connections, want 1", up.conns.Load())
	}
}

// TestH2CCancelResetsUpstream cancels a stream held open by the upstream,
// from a sibling: the upstream's handler sees its request end (RST_STREAM),
// and the stream's unit of capacity comes back.
func TestH2CCancelResetsUpstream(t *testing.T) {
	up := newH2Upstream(t, 100)
	owner, client := remotePair(t, h2cConf)
	warmH2(t, owner, up.url)
	for _, m := range []*member{owner, client} {
		ctx, cancel := context.WithCancel(context.Background())
		resp, err := m.tr.RoundTrip(grpcReq(t, ctx, up.url+"/hold", http.NoBody))
		if err != nil {
			t.Fatal(err)
		}
		waitFor(t, 5*time.Second, "the upstream handler to run", func() bool { return up.cur.Load() == 1 })
		cancel()
		if _, err := io.Copy(io.Discard, resp.Body); err == nil {
			t.Fatal("body of a cancelled stream ended cleanly")
		}
		resp.Body.Close()
		waitFor(t, 5*time.Second, "the upstream to see the stream reset", func() bool { return up.cur.Load() == 0 })
	}
	waitFor(t, 5*time.Second, "the capacity to come back", func() bool {
		c, _ := owner.pool.Candidates(mustKey(t, owner.tr, up.url), nil)
		return len(c) == 1 && c[0].InUse == 0 && c[0].Pending == 0
	})
}

func mustKey(t testing.TB, tr *Transport, url string) orbitpool.Key {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	_, k, err := tr.Upstream(req)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// TestH2CCapacityIsStreamLimit: the connection is registered with the
// upstream's SETTINGS_MAX_CONCURRENT_STREAMS, and load that fits in it
// from two members uses one connection and never more streams.
func TestH2CCapacityIsStreamLimit(t *testing.T) {
	up := newH2Upstream(t, 3)
	owner, client := remotePair(t, h2cConf)
	warmH2(t, owner, up.url)
	c, _ := owner.pool.Candidates(mustKey(t, owner.tr, up.url), nil)
	if len(c) != 1 || c[0].Capacity != 3 {
		t.Fatalf("candidates %+v: want one with capacity 3", c)
	}
	var wg sync.WaitGroup
	var failed atomic.Int64
	for i := range 12 {
		m := []*member{owner, client}[i%2]
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			resp, err := m.tr.RoundTrip(grpcReq(t, ctx, up.url+"/slow", http.NoBody))
			if err != nil {
				failed.Add(1)
				t.Error(err)
				return
			}
			drain(resp)
		}()
	}
	wg.Wait()
	if up.conns.Load() != 1 || up.peak.Load() > 3 || failed.Load() != 0 {
		t.Fatalf("%d connections, %d concurrent streams at most, %d failures: want 1, <= 3, 0", up.conns.Load(), up.peak.Load(), failed.Load())
	}
}

// TestH2CGoAwayDrains: after GOAWAY the stream in flight finishes, and the
// next request goes to a new connection.
func TestH2CGoAwayDrains(t *testing.T) {
	up := newH2Upstream(t, 100)
	owner, client := remotePair(t, h2cConf)
	warmH2(t, owner, up.url)
	resp, err := client.tr.RoundTrip(grpcReq(t, context.Background(), up.url+"/slow", http.NoBody))
	if err != nil {
		t.Fatal(err)
	}
	go up.goAway()
	p, err := grpcmsg.Read(resp.Body)
	if err != nil || string(p) != "slow" {
		t.Fatalf("stream in flight across GOAWAY: %q, %v", p, err)
	}
	drain(resp)
	if resp.Trailer.Get("Grpc-Status") != "0" {
		t.Fatalf("trailers %v", resp.Trailer)
	}
	key := mustKey(t, owner.tr, up.url)
	waitFor(t, 5*time.Second, "the drained connection to leave the pool", func() bool { return owner.pool.Live(key) == 0 })
}

// TestH2GoAwayLeavesPoolWithoutSweep: a connection that got GOAWAY while a
// stream ran closes once the stream ends, and leaves the pool then, with
// the sweep an hour away and no request to look at it. With Go 1.27's
// net/http client under x/net's wrapper, the ClientConn says nothing of the
// GOAWAY until it has closed, and nothing reads the socket after that: only
// x/net's MarkDead tells.
func TestH2GoAwayLeavesPoolWithoutSweep(t *testing.T) {
	up := newH2Upstream(t, 100)
	m := newMemberOpts(t, testSpecLocal, NodeOptions{SweepInterval: time.Hour}, h2cConf)
	warmH2(t, m, up.url)
	key := mustKey(t, m.tr, up.url)
	resp, err := m.tr.RoundTrip(grpcReq(t, context.Background(), up.url+"/slow", http.NoBody))
	if err != nil {
		t.Fatal(err)
	}
	go up.goAway()
	if p, err := grpcmsg.Read(resp.Body); err != nil || string(p) != "slow" {
		t.Fatalf("stream in flight across GOAWAY: %q, %v", p, err)
	}
	drain(resp)
	waitFor(t, 3*time.Second, "the connection, closed after its GOAWAY, to leave the pool", func() bool { return m.pool.Live(key) == 0 })
}

// TestH2CSiblingDialsOnceWhenOwnerBehind: a connection whose owner has
// all its orbitpool.PendingReservations reserved by siblings and not yet
// accepted counts as full, so a sibling's request then dials a connection
// of its own, whatever room the stream limit leaves, and the sibling's next
// requests use that one rather than dial again. With one reservation fewer
// pending, the request goes to the owner's connection. The reservations
// stand for an owner behind on its accepts, as on a loaded machine while a
// burst of more than PendingReservations streams reaches one sibling.
func TestH2CSiblingDialsOnceWhenOwnerBehind(t *testing.T) {
	up := newH2Upstream(t, 100)
	ms := newFleet(t, 2, func(tr *Transport) {
		tr.H2C = true
		tr.MaxConnsPerKey = 4
	})
	owner, client := ms[0], ms[1]
	warmH2(t, owner, up.url)
	cands, err := client.pool.Candidates(mustKey(t, owner.tr, up.url), nil)
	if err != nil || len(cands) != 1 || cands[0].Local || cands[0].Capacity != 100 {
		t.Fatalf("candidates seen by the sibling: %+v, %v; want the owner's connection, capacity 100", cands, err)
	}
	id := cands[0].ID
	reserve := func(n int) {
		for range n {
			if _, err := client.pool.Reserve(id); err != nil {
				t.Fatalf("reserve: %v", err)
			}
		}
	}
	call := func() {
		t.Helper()
		resp, err := client.tr.RoundTrip(grpcReq(t, context.Background(), up.url+"/unary", bytes.NewReader(grpcmsg.Frame([]byte("x")))))
		if err != nil {
			t.Fatal(err)
		}
		drain(resp)
		if resp.Trailer.Get("Grpc-Status") != "0" {
			t.Fatalf("trailers %v", resp.Trailer)
		}
	}

	reserve(orbitpool.PendingReservations - 1)
	call()
	if st := client.node.Stats(); st.ReusedRemote != 1 || st.Created != 0 || up.conns.Load() != 1 {
		t.Fatalf("%d reservations pending: sibling %+v, %d connections; want the request on the owner's connection", orbitpool.PendingReservations-1, st, up.conns.Load())
	}
	// The request's own lease was accepted: one more makes them all.
	reserve(1)
	for range 3 {
		call()
	}
	st := client.node.Stats()
	if st.Created != 1 || st.ReusedLocal != 2 || st.ReusedRemote != 1 || up.conns.Load() != 2 {
		t.Fatalf("%d reservations pending, three requests: sibling %+v, %d connections; want one dial and its connection reused", orbitpool.PendingReservations, st, up.conns.Load())
	}
	// The owner's own requests take no reservation: its connection is
	// there for them, whatever the sibling found.
	before := owner.node.Stats()
	resp, err := owner.tr.RoundTrip(grpcReq(t, context.Background(), up.url+"/unary", bytes.NewReader(grpcmsg.Frame([]byte("x")))))
	if err != nil {
		t.Fatal(err)
	}
	drain(resp)
	if after := owner.node.Stats(); after.ReusedLocal != before.ReusedLocal+1 || after.ReusedRemote != before.ReusedRemote || after.Created != before.Created || up.conns.Load() != 2 {
		t.Fatalf("owner's request: %+v before, %+v after, %d connections; want it on its own connection", before, after, up.conns.Load())
	}
}

// TestH2COwnerUsesItsConnectionWhileSiblingsReservedAll: with every one of
// the PendingReservations on the owner's HTTP/2 connection taken by a
// sibling and not yet accepted, and no budget for another connection, a
// sibling's request finds no room and waits; the owner's own requests,
// which need no reservation, still run on the connection at once.
func TestH2COwnerUsesItsConnectionWhileSiblingsReservedAll(t *testing.T) {
	up := newH2Upstream(t, 100)
	owner, client := remotePair(t, h2cConf)
	warmH2(t, owner, up.url)
	cands, err := client.pool.Candidates(mustKey(t, owner.tr, up.url), nil)
	if err != nil || len(cands) != 1 {
		t.Fatalf("candidates seen by the sibling: %+v, %v", cands, err)
	}
	for range orbitpool.PendingReservations {
		if _, err := client.pool.Reserve(cands[0].ID); err != nil {
			t.Fatalf("reserve: %v", err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if resp, err := client.tr.RoundTrip(grpcReq(t, ctx, up.url+"/unary", bytes.NewReader(grpcmsg.Frame([]byte("x"))))); err == nil {
		drain(resp)
		t.Fatalf("sibling's request ran with every reservation taken and no budget to dial: %+v", client.node.Stats())
	}
	// Well within the reservations' timeout (a second), which would give
	// their room back.
	ctx, cancel = context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	for i := range 3 {
		resp, err := owner.tr.RoundTrip(grpcReq(t, ctx, up.url+"/unary", bytes.NewReader(grpcmsg.Frame([]byte("x")))))
		if err != nil {
			t.Fatalf("owner's request %d: %v; owner %+v", i, err, owner.node.Stats())
		}
		drain(resp)
	}
	if st := owner.node.Stats(); st.ReusedLocal != 3 || st.Created != 1 || up.conns.Load() != 1 {
		t.Fatalf("owner %+v, %d connections; want its three requests on its one connection", st, up.conns.Load())
	}
}

// TestH2CColdBurstDialsOnce: a burst of twelve concurrent requests from
// two members to a cold h2c upstream opens one connection (the others wait
// for it rather than dial their own), every request succeeds, and no lease
// on the new connection is refused; HTTP/1.1
// dials are not held back: eight requests the upstream holds until all
// eight have arrived open eight connections at once.
func TestH2CColdBurstDialsOnce(t *testing.T) {
	up := newH2Upstream(t, 100)
	ms := newFleet(t, 2, h2cConf)
	start := make(chan struct{})
	// Six from each: a connection with all its PendingReservations (8) in
	// flight to its owner counts as full, and a bigger burst from one
	// sibling may dial a second connection.
	const burst = 12
	errs := make(chan error, burst)
	for i := range burst {
		go func() {
			<-start
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			resp, err := ms[i%2].tr.RoundTrip(grpcReq(t, ctx, up.url+"/slow", http.NoBody))
			if err == nil {
				var b []byte
				b, err = io.ReadAll(resp.Body)
				resp.Body.Close()
				if err == nil && (resp.Trailer.Get("Grpc-Status") != "0" || !bytes.Contains(b, []byte("slow"))) {
					err = fmt.Errorf("%d %q %v", resp.StatusCode, b, resp.Trailer)
				}
			}
			errs <- err
		}()
	}
	close(start)
	for range burst {
		if err := <-errs; err != nil {
			t.Errorf("request in the burst: %v", err)
		}
	}
	if c := up.conns.Load(); c != 1 {
		t.Errorf("a burst of %d to a cold h2c upstream opened %d connections, want 1; members: %+v, %+v", burst, c, ms[0].node.Stats(), ms[1].node.Stats())
	}
	if p := up.peak.Load(); p < 2 {
		t.Errorf("at most %d streams at once: the burst did not overlap", p)
	}
	// The waiters woken by the new connection's room present their leases
	// at once: none is refused for a connection not yet installed.
	for i, m := range ms {
		if st := m.node.Stats(); st.Refused != 0 {
			t.Errorf("member %d refused %d leases in the burst: %v", i, st.Refused, st.RefusedBy)
		}
	}

	// HTTP/1.1.
	const n = 8
	var arrived atomic.Int64
	all := make(chan struct{})
	h1 := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if arrived.Add(1) == n {
			close(all)
		}
		select {
		case <-all:
		case <-time.After(5 * time.Second):
		}
		io.WriteString(w, "ok")
	}))
	defer h1.Close()
	h1ms := newFleet(t, 2, nil)
	for i := range n {
		go func() {
			req, _ := http.NewRequest("GET", h1.URL+"/", nil)
			resp, err := h1ms[i%2].tr.RoundTrip(req)
			if err == nil {
				_, err = io.ReadAll(resp.Body)
				resp.Body.Close()
			}
			errs <- err
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Errorf("HTTP/1.1 request: %v", err)
		}
	}
	select {
	case <-all:
	default:
		t.Errorf("%d of %d HTTP/1.1 requests reached the upstream at once: their dials were held back", arrived.Load(), n)
	}
}
