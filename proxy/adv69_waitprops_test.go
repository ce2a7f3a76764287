package proxy

import (
	"context"
	"errors"
	"io"
	"net/http"
	"runtime"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/orbitpool"
)

// TestAdv69H2CStreamsBusyTableFull: an h2c upstream whose one connection
// has all its streams (1) busy, with the rest of the table held by another
// upstream: its request waits for a stream, dials nothing, and is served
// once the stream frees.
func TestAdv69H2CStreamsBusyTableFull(t *testing.T) {
	spec := orbitpool.PoolSpec{Lanes: 1, Keys: 4, ResourcesPerLane: 2}
	release, closed := make(chan struct{}), make(chan bool, 4)
	defer close(release)
	url := unpooledUpstream(t, release, closed)
	hold := make(chan struct{})
	s := newH2CServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/hold" {
			w.Write([]byte("x"))
			w.(http.Flusher).Flush()
			<-hold
			return
		}
		io.WriteString(w, "ok")
	}, 1)
	m := newMember(t, spec, func(tr *Transport) { tr.H2C = true; tr.HTTP2 = true })
	h1 := &member{pool: m.pool, node: m.node, tr: &Transport{Node: m.node}}
	holdStreams(t, h1, url, 1)
	req, _ := http.NewRequest("GET", s.url+"/hold", nil)
	resp, err := m.tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close() // the table is full now
	done := make(chan error, 1)
	go func() {
		body, err := adv69Get(m.tr, s.url+"/", 5*time.Second)
		if err == nil && body != "ok" {
			err = errors.New("body " + body)
		}
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("the h2c request returned (%v) while its connection's one stream was busy", err)
	case <-time.After(300 * time.Millisecond):
	}
	close(hold)
	drain(resp)
	if err := <-done; err != nil {
		t.Fatalf("the h2c request after the stream freed: %v", err)
	}
	if n := s.conns.Load(); n != 1 {
		t.Fatalf("the h2c upstream saw %d connections; want its one", n)
	}
	if u := m.node.Stats().Unpooled; u != 0 {
		t.Fatalf("%d unpooled", u)
	}
}

// TestAdv69FullWaitLeavesNothing: capped requests that wait on a full table
// and run out of time (or are canceled) leave no goroutine, dial count or
// waiter behind: once the held connections free, a request is served at
// once on one of them, and the process's goroutines are back to before.
func TestAdv69FullWaitLeavesNothing(t *testing.T) {
	spec := orbitpool.PoolSpec{Lanes: 1, Keys: 4, ResourcesPerLane: 2}
	release, closed := make(chan struct{}), make(chan bool, 64)
	url := unpooledUpstream(t, release, closed)
	m := newMember(t, spec, func(tr *Transport) { tr.MaxConnsPerKey = 4; tr.MaxDialingPerKey = 1 })
	held := holdStreams(t, m, url, 2)
	base := runtime.NumGoroutine()
	errs := make(chan error, 8)
	for i := range 8 {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Duration(100+30*i)*time.Millisecond)
			defer cancel()
			if i%2 == 1 {
				go func() { time.Sleep(50 * time.Millisecond); cancel() }()
			}
			req, _ := http.NewRequestWithContext(ctx, "GET", url+"/once", nil)
			resp, err := m.tr.RoundTrip(req)
			if err == nil {
				resp.Body.Close()
				err = errors.New("served")
			}
			errs <- err
		}()
	}
	for range 8 {
		if err := <-errs; !errors.Is(err, orbitpool.ErrFull) && !errors.Is(err, context.Canceled) && !errors.Is(err, ErrNoCapacity) && !isRefusal(err) {
			t.Errorf("a waiting request ended with %v; want a refusal or its cancellation", err)
		}
	}
	if d := m.node.dialing.Load(); d != 0 {
		t.Fatalf("dialing %d after the waits", d)
	}
	close(release)
	for _, r := range held {
		drain(r)
	}
	start := time.Now()
	if body, err := adv69Get(m.tr, url+"/once", 2*time.Second); err != nil || body != "ok" || time.Since(start) > 500*time.Millisecond {
		t.Fatalf("a request once the connections freed: %q, %v after %v", body, err, time.Since(start))
	}
	if s := m.node.Stats(); s.Created != 2 || s.Unpooled != 0 {
		t.Fatalf("stats %+v: want the 2 connections only", s)
	}
	waitFor(t, 3*time.Second, "goroutines back", func() bool { return runtime.NumGoroutine() <= base })
}

// TestAdv69CloseDuringFullWait: the node closes while a capped request waits
// on a full table: the request returns promptly, and no upstream
// connection is dialed by, or left open in, the closed node. (Pre-existing:
// any RoundTrip after Node.Close dials and installs a connection.)
func TestAdv69CloseDuringFullWait(t *testing.T) {
	spec := orbitpool.PoolSpec{Lanes: 1, Keys: 4, ResourcesPerLane: 2}
	release, closed := make(chan struct{}), make(chan bool, 64)
	defer close(release)
	url := unpooledUpstream(t, release, closed)
	m := newMember(t, spec, func(tr *Transport) { tr.MaxConnsPerKey = 4 })
	holdStreams(t, m, url, 2)
	created := m.node.Stats().Created
	done := make(chan error, 1)
	go func() {
		_, err := adv69Get(m.tr, url+"/once", 5*time.Second)
		done <- err
	}()
	time.Sleep(200 * time.Millisecond)
	m.node.Close()
	select {
	case <-done:
	case <-time.After(2 * time.Second):
		t.Fatal("the waiting request did not return after Close")
	}
	time.Sleep(300 * time.Millisecond)
	s := m.node.Stats()
	if s.OpenConns != 0 || s.Created != created || m.node.open.Load() != 0 {
		t.Fatalf("after Close: %+v (open %d, %d created before); want nothing dialed or open", s, m.node.open.Load(), created)
	}
}
