package proxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/internal/grpcmsg"
)

// endlessUpstream: /endless streams messages until the request's context
// ends, counting the handlers that saw it end; /never answers nothing
// until then; anything else is "ok".
type endlessUpstream struct {
	*h2cServer
	running atomic.Int64
	ended   atomic.Int64
}

func newEndlessUpstream(t *testing.T, maxStreams ...int) *endlessUpstream {
	u := &endlessUpstream{}
	u.h2cServer = newH2CServer(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/endless":
			u.running.Add(1)
			defer u.running.Add(-1)
			w.WriteHeader(http.StatusOK)
			for {
				if _, err := w.Write(grpcmsg.Frame([]byte("tick"))); err != nil {
					break
				}
				w.(http.Flusher).Flush()
				select {
				case <-r.Context().Done():
					u.ended.Add(1)
					return
				case <-time.After(2 * time.Millisecond):
				}
			}
			<-r.Context().Done()
			u.ended.Add(1)
		case "/never":
			u.running.Add(1)
			defer u.running.Add(-1)
			<-r.Context().Done()
			u.ended.Add(1)
		default:
			io.WriteString(w, "ok")
		}
	}, maxStreams...)
	return u
}

// TestAdv5H2CloseBodyEarlyThroughSibling: a caller that closes an endless
// response body after its first message, through a sibling, resets the
// stream upstream (the handler sees its request end) and the stream's
// unit comes back, as on the owner's local path; the sibling's next
// request works.
func TestAdv5H2CloseBodyEarlyThroughSibling(t *testing.T) {
	up := newEndlessUpstream(t)
	owner, client := h2Pair(t, up.url)
	for i, m := range []*member{owner, client, client} {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		resp, err := m.tr.RoundTrip(grpcReq(t, ctx, up.url+"/endless", http.NoBody))
		if err != nil {
			cancel()
			t.Fatalf("call %d: %v", i, err)
		}
		if p, err := grpcmsg.Read(resp.Body); err != nil || string(p) != "tick" {
			t.Fatalf("call %d: first message %q %v", i, p, err)
		}
		closed := make(chan struct{})
		go func() { resp.Body.Close(); close(closed) }()
		select {
		case <-closed:
		case <-time.After(2 * time.Second):
			t.Fatalf("call %d: Close of the response body blocked", i)
		}
		waitFor(t, 3*time.Second, "the upstream handler to see its stream reset", func() bool { return up.ended.Load() == int64(i+1) })
		capacityBack(t, owner, up.url)
		cancel()
	}
	if err := getOK(client, context.Background(), up.url+"/"); err != nil {
		t.Errorf("the sibling's next request: %v", err)
	}
	if n := up.conns.Load(); n != 1 {
		t.Errorf("upstream saw %d connections, want the one", n)
	}
}

// TestAdv5H2DeadlineWithoutAnswer: an upstream that never answers a
// stream: through a sibling, RoundTrip returns by the request's deadline
// (and a little), with the deadline's error, and the stream is reset
// upstream and its unit comes back.
func TestAdv5H2DeadlineWithoutAnswer(t *testing.T) {
	up := newEndlessUpstream(t)
	owner, client := h2Pair(t, up.url)
	for i, m := range []*member{owner, client} {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		start := time.Now()
		_, err := m.tr.RoundTrip(grpcReq(t, ctx, up.url+"/never", bytes.NewReader(grpcmsg.Frame([]byte("q")))))
		took := time.Since(start)
		cancel()
		if err == nil || !errors.Is(err, context.DeadlineExceeded) || took > time.Second {
			t.Errorf("call %d: %v after %v; want the deadline's error by the deadline", i, err, took)
		}
		waitFor(t, 3*time.Second, "the upstream handler to see its stream reset", func() bool { return up.ended.Load() == int64(i+1) })
		capacityBack(t, owner, up.url)
	}
	if err := getOK(client, context.Background(), up.url+"/"); err != nil {
		t.Errorf("the sibling's next request: %v", err)
	}
}

// TestAdv5H2OwnerClosedMidStream: the owner's Node closes while a
// sibling's stream on its connection is streaming: the sibling's read ends
// with an error within a bound, not at its deadline, and the sibling's
// next request dials a connection of its own and works.
func TestAdv5H2OwnerClosedMidStream(t *testing.T) {
	up := newEndlessUpstream(t)
	owner, client := h2Pair(t, up.url)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	resp, err := client.tr.RoundTrip(grpcReq(t, ctx, up.url+"/endless", http.NoBody))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if p, err := grpcmsg.Read(resp.Body); err != nil || string(p) != "tick" {
		t.Fatalf("first message %q %v", p, err)
	}
	closed := make(chan struct{})
	go func() { owner.node.Close(); close(closed) }()
	readErr := make(chan error, 1)
	go func() {
		_, err := io.Copy(io.Discard, resp.Body)
		readErr <- err
	}()
	select {
	case err := <-readErr:
		if err == nil {
			t.Errorf("the stream of a closed owner ended cleanly")
		}
	case <-time.After(3 * time.Second):
		t.Fatalf("the sibling's read did not end after its owner closed")
	}
	select {
	case <-closed:
	case <-time.After(3 * time.Second):
		t.Fatalf("the owner's Close did not return")
	}
	waitFor(t, 3*time.Second, "the upstream handler to see its stream end", func() bool { return up.running.Load() == 0 })
	ctx2, cancel2 := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel2()
	if err := getOK(client, ctx2, up.url+"/"); err != nil {
		t.Errorf("the sibling's next request: %v", err)
	}
}

// TestAdv5H2UpstreamCutWithStreamsInFlight: the upstream closes its
// connection while the owner's and a sibling's streams run on it: both
// reads end with an error within a bound, the connection leaves the pool,
// and the next requests work on a new connection.
func TestAdv5H2UpstreamCutWithStreamsInFlight(t *testing.T) {
	up := newRawH2(t, func(s *rawStream) {
		switch s.path {
		case "/stream":
			s.headers(false, ":status", "200", "content-type", "application/grpc")
			for range 2000 {
				if s.data(false, grpcmsg.Frame([]byte("tick"))) != nil {
					return
				}
				time.Sleep(2 * time.Millisecond)
			}
		default:
			s.headers(false, ":status", "200")
			s.data(true, []byte("ok"))
		}
	})
	owner, client := h2Pair(t, up.url)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var bodies []io.ReadCloser
	for _, m := range []*member{owner, client} {
		resp, err := m.tr.RoundTrip(grpcReq(t, ctx, up.url+"/stream", http.NoBody))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if p, err := grpcmsg.Read(resp.Body); err != nil || string(p) != "tick" {
			t.Fatalf("first message %q %v", p, err)
		}
		bodies = append(bodies, resp.Body)
	}
	up.cut()
	for i, b := range bodies {
		readErr := make(chan error, 1)
		go func() {
			_, err := io.Copy(io.Discard, b)
			readErr <- err
		}()
		select {
		case err := <-readErr:
			if err == nil {
				t.Errorf("stream %d ended cleanly on a cut connection", i)
			}
		case <-time.After(3 * time.Second):
			t.Fatalf("stream %d: the read did not end after the upstream cut the connection", i)
		}
	}
	key := mustKey(t, owner.tr, up.url)
	waitFor(t, 3*time.Second, "the cut connection to leave the pool", func() bool { return owner.pool.Live(key) == 0 })
	for _, m := range []*member{client, owner} {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := getOK(m, ctx, up.url+"/"); err != nil {
			t.Errorf("request after the cut: %v", err)
		}
		cancel()
	}
}

// TestAdv5H2LargeBodiesBothWaysNoLeak: 3 MiB up (unknown length, with a
// request trailer) and 3 MiB back (unknown length, with a trailer) through
// a sibling, a few times; the bytes and trailers arrive whole, and
// afterwards the stream units and goroutines are back where they were.
func TestAdv5H2LargeBodiesBothWaysNoLeak(t *testing.T) {
	up := newH2Upstream(t, 100)
	owner, client := remotePair(t, h2cConf)
	warmH2(t, owner, up.url)
	big := bytes.Repeat([]byte("0123456789abcdef"), 3<<20/16)
	run := func() {
		pr, pw := io.Pipe()
		go func() {
			pw.Write(grpcmsg.Frame(big))
			pw.Close()
		}()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		req := grpcReq(t, ctx, up.url+"/unary", pr)
		req.Trailer = http.Header{"X-Req-Trailer": {"big"}}
		resp, err := client.tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil || !bytes.Equal(b, grpcmsg.Frame(big)) || resp.Trailer.Get("Grpc-Status") != "0" || resp.Trailer.Get("X-Got-Trailer") != "big" {
			t.Fatalf("%d bytes back (%v), trailers %v", len(b), err, resp.Trailer)
		}
	}
	run()
	capacityBack(t, owner, up.url)
	g0 := runtime.NumGoroutine()
	for range 3 {
		run()
	}
	capacityBack(t, owner, up.url)
	goroutinesBackTo(t, g0)
	if s := client.node.Stats(); s.Created != 0 || s.ReusedRemote != 4 {
		t.Errorf("sibling %+v: want every request through the owner", s)
	}
}

// TestAdv5H2OwnerShutdownLetsSiblingStreamFinish: an owner that leaves by
// Shutdown while a sibling's stream on its HTTP/2 connection is running
// lets it finish: the sibling reads every message and grpc-status. The
// connection is drained (nothing new is reserved on it) and leaves the
// pool, and the sibling's next request works on a connection of its own.
func TestAdv5H2OwnerShutdownLetsSiblingStreamFinish(t *testing.T) {
	up := newH2Upstream(t, 100)
	owner, client := remotePair(t, h2cConf)
	warmH2(t, owner, up.url)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pr, pw := io.Pipe()
	defer pw.Close()
	req := grpcReq(t, ctx, up.url+"/echo", pr)
	got, errc := headAsync(client.tr, req)
	pw.Write(grpcmsg.Frame([]byte("m0")))
	var resp *http.Response
	select {
	case resp = <-got:
	case err := <-errc:
		t.Fatal(err)
	case <-time.After(5 * time.Second):
		t.Fatal("no head")
	}
	defer resp.Body.Close()
	if p, err := grpcmsg.Read(resp.Body); err != nil || string(p) != "m0" {
		t.Fatalf("m0: %q %v", p, err)
	}
	shut := make(chan error, 1)
	go func() {
		sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer scancel()
		shut <- owner.node.Shutdown(sctx)
	}()
	key := mustKey(t, owner.tr, up.url)
	waitFor(t, 3*time.Second, "the connection to be drained", func() bool {
		c, _ := client.pool.Candidates(key, nil)
		return len(c) == 1 && c[0].Capacity == 0
	})
	for i := 1; i < 5; i++ {
		pw.Write(grpcmsg.Frame([]byte(fmt.Sprint("m", i))))
		if p, err := grpcmsg.Read(resp.Body); err != nil || string(p) != fmt.Sprint("m", i) {
			t.Fatalf("m%d during the owner's shutdown: %q %v", i, p, err)
		}
	}
	pw.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil || resp.Trailer.Get("Grpc-Status") != "0" {
		t.Fatalf("end of the stream: %v, trailers %v", err, resp.Trailer)
	}
	select {
	case err := <-shut:
		if err != nil {
			t.Errorf("Shutdown: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Shutdown did not return after the sibling's stream ended")
	}
	if owner.node.Stats().OpenConns != 0 {
		t.Errorf("owner %+v: want its connection closed", owner.node.Stats())
	}
	ctx2, cancel2 := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel2()
	resp2, err := client.tr.RoundTrip(grpcReq(t, ctx2, up.url+"/unary", bytes.NewReader(grpcmsg.Frame([]byte("after")))))
	if err != nil {
		t.Fatalf("the sibling's next request: %v", err)
	}
	drain(resp2)
	if s := client.node.Stats(); s.Created != 1 {
		t.Errorf("sibling %+v: want a connection of its own after the owner left", s)
	}
}
