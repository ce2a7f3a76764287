package proxy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/orbitpool"
)

const adv71cBig = 1 << 20

// adv71cHeldBody is an upstream (raw) whose /warm answers at once with a
// length, and whose /body?kind=K sends a response head of kind K and the
// first part of its body, signals started, and sends the rest only once
// release is closed. Kinds: "cd" (HTTP/1.1, close-delimited), "http10"
// (HTTP/1.0, close-delimited), "cl" (Content-Length), "chunked".
func adv71cHeldBody(t *testing.T, started chan<- string, release <-chan struct{}) string {
	return rawUpstream(t, func(c net.Conn, br *bufio.Reader, req *http.Request) bool {
		if req.URL.Path == "/warm" {
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
			return true
		}
		kind := req.URL.Query().Get("kind")
		const first, rest = "part-one;", "part-two;"
		switch kind {
		case "cd":
			io.WriteString(c, "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n"+first)
		case "http10":
			io.WriteString(c, "HTTP/1.0 200 OK\r\n\r\n"+first)
		case "cl":
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: "+strconv.Itoa(len(first+rest))+"\r\n\r\n"+first)
		case "chunked":
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n", len(first), first)
		case "bigcl":
			// Long enough for the owner to splice it to the sibling.
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: "+strconv.Itoa(adv71cBig)+"\r\n\r\n"+first+strings.Repeat("x", adv71cBig/2-len(first)))
		}
		select {
		case started <- kind:
		default:
		}
		select {
		case <-release:
		case <-time.After(10 * time.Second):
		}
		switch kind {
		case "chunked":
			fmt.Fprintf(c, "%x\r\n%s\r\n0\r\n\r\n", len(rest), rest)
		case "bigcl":
			io.WriteString(c, strings.Repeat("y", adv71cBig-adv71cBig/2))
		default:
			io.WriteString(c, rest)
		}
		if kind == "cd" || kind == "http10" {
			c.Close()
			return false
		}
		return true // framed: the connection stays open for the next request
	})
}

// TestAdv71cOwnerCloseMidBodyNeverTruncatedSuccess: the owner's Node closes
// (hard Close, as after a Shutdown whose context ended) while a response
// body is streaming, to a sibling through the unix leg or to the owner's
// own caller. Whatever the response's framing, and in particular a
// close-delimited one, whose end is the connection's close, the reader must
// see an error, never io.EOF after the first part: a truncated body
// reported as complete is a corrupted response passed on as a good one.
func TestAdv71cOwnerCloseMidBodyNeverTruncatedSuccess(t *testing.T) {
	for _, kind := range []string{"cd", "http10", "cl", "chunked", "bigcl"} {
		for _, via := range []string{"sibling", "local"} {
			t.Run(kind+"/"+via, func(t *testing.T) {
				started := make(chan string, 1)
				release := make(chan struct{})
				var once sync.Once
				rel := func() { once.Do(func() { close(release) }) }
				defer rel()
				base := adv71cHeldBody(t, started, release)
				owner, client := remotePair(t, nil)
				warm(t, owner, base+"/warm")
				rt := http.RoundTripper(client.tr)
				if via == "local" {
					rt = owner.tr
				}
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				resp, err := get(t, ctx, rt, base+"/body?kind="+kind)
				if err != nil {
					rel()
					t.Fatalf("round trip: %v", err)
				}
				defer resp.Body.Close()
				if got, err := readWithTimeout(resp.Body, len("part-one;"), 5*time.Second); err != nil || got != "part-one;" {
					rel()
					t.Fatalf("first part: %q %v", got, err)
				}
				closed := make(chan struct{})
				go func() {
					defer close(closed)
					owner.node.Close()
				}()
				type res struct {
					b   []byte
					err error
				}
				ch := make(chan res, 1)
				go func() {
					b, err := io.ReadAll(resp.Body)
					ch <- res{b, err}
				}()
				var r res
				select {
				case r = <-ch:
				case <-time.After(5 * time.Second):
					rel()
					t.Fatal("body read did not end within 5s of the owner's Close")
				}
				rel()
				select {
				case <-closed:
				case <-time.After(5 * time.Second):
					t.Fatal("owner's Close did not return")
				}
				if r.err == nil {
					t.Fatalf("body after the owner's Close ended cleanly with %q after %q: a truncated body reported as complete", r.b, "part-one;")
				}
			})
		}
	}
}

// TestAdv71cShutdownWaitsForSiblingUpload: a sibling's request whose body
// is still streaming through the unix leg when its owner begins Shutdown
// (a reload) goes on to its end: the owner keeps its socket and the
// connection until that exchange ends (THREATS "Lifecycle"), the upstream
// gets the whole body, and the sibling the whole answer. Shutdown returns
// only after that.
func TestAdv71cShutdownWaitsForSiblingUpload(t *testing.T) {
	const half = 64 << 10
	bodyBegan := make(chan struct{}, 1)
	base := rawUpstream(t, func(c net.Conn, br *bufio.Reader, req *http.Request) bool {
		if req.URL.Path == "/warm" {
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
			return true
		}
		buf := make([]byte, 1)
		n, err := io.ReadFull(req.Body, buf)
		select {
		case bodyBegan <- struct{}{}:
		default:
		}
		if err == nil {
			m, _ := io.Copy(io.Discard, req.Body)
			n += int(m)
		}
		msg := "got=" + strconv.Itoa(n)
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: "+strconv.Itoa(len(msg))+"\r\n\r\n"+msg)
		return true
	})
	owner, client := remotePair(t, nil)
	warm(t, owner, base+"/warm")

	pr, pw := io.Pipe()
	defer pw.CloseWithError(errors.New("test over"))
	req, _ := http.NewRequest("POST", base+"/up", pr)
	req.ContentLength = 2 * half
	done := sendAsync(client.tr, req)
	if _, err := pw.Write(make([]byte, half)); err != nil {
		t.Fatalf("first half: %v", err)
	}
	select {
	case <-bodyBegan:
	case <-time.After(5 * time.Second):
		t.Fatal("the upstream never saw the body begin")
	}
	if client.node.Stats().ReusedRemote == 0 {
		t.Fatalf("the request did not go through the owner: %+v", client.node.Stats())
	}
	shut := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		shut <- owner.node.Shutdown(ctx)
	}()
	time.Sleep(150 * time.Millisecond)
	select {
	case err := <-shut:
		pw.CloseWithError(errors.New("abandoned"))
		t.Fatalf("Shutdown returned (%v) while a sibling's upload through it was still streaming", err)
	default:
	}
	if _, err := pw.Write(make([]byte, half)); err != nil {
		t.Fatalf("second half: %v", err)
	}
	pw.Close()
	var r roundTripResult
	select {
	case r = <-done:
	case <-time.After(12 * time.Second):
		t.Fatal("sibling's request did not end")
	}
	if r.err != nil || r.body != "got="+strconv.Itoa(2*half) {
		t.Fatalf("sibling's upload across the owner's Shutdown: body %q err %v, want got=%d", r.body, r.err, 2*half)
	}
	select {
	case err := <-shut:
		if err != nil {
			t.Fatalf("Shutdown: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Shutdown did not return after the last exchange ended")
	}
}

// adv71cTableQuiet waits until the table, as p reads it, holds no
// connection, creation, user or reservation of any key.
func adv71cTableQuiet(t *testing.T, p *orbitpool.Pool, within time.Duration) {
	t.Helper()
	var last orbitpool.Snapshot
	for end := time.Now().Add(within); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		s, err := p.Snapshot()
		if err != nil {
			t.Fatalf("snapshot: %v", err)
		}
		last = s
		quiet := true
		for _, k := range s.Keys {
			if k.Live != 0 || k.Creating != 0 || k.InUse != 0 || k.Pending != 0 || k.Busy != 0 {
				quiet = false
			}
		}
		for _, l := range s.Lanes {
			if l.Resources != 0 {
				quiet = false
			}
		}
		if quiet {
			return
		}
	}
	t.Fatalf("table not quiet after every node closed: keys %+v lanes %+v", last.Keys, last.Lanes)
}

// TestAdv71cReloadDrainCountsReturnToZero: a reload. The old process (A)
// owns the only connection its key may have; the new one (B) joins and its
// requests use A's connection through the unix leg, one of them streaming a
// response when A begins Shutdown. That one gets its whole body; every
// request B sends while A drains and after succeeds (on A's connection
// until it leaves, then on B's own); and once both have closed, a third
// process reading the table finds no connection, reservation or user left
// for any key.
func TestAdv71cReloadDrainCountsReturnToZero(t *testing.T) {
	u := newTestUpstream(t)
	spec := testSpec
	spec.Path = filepath.Join(t.TempDir(), "seg")
	conf := func(tr *Transport) { tr.MaxConnsPerKey = 1 }
	a := newMember(t, spec, conf)
	obs, err := orbitpool.Open(spec, orbitpool.Options{ReconcileInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer obs.Close()
	warm(t, a, u.url("/cl"))
	b := newMember(t, spec, conf)

	g := u.gate("reload")
	defer func() {
		for range 2 {
			select {
			case g <- struct{}{}:
			default:
			}
		}
	}()
	resp, err := get(t, context.Background(), b.tr, u.url("/stream?id=reload"))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if got, err := readWithTimeout(resp.Body, len("chunk-0;"), 5*time.Second); err != nil || got != "chunk-0;" {
		t.Fatalf("first chunk: %q %v", got, err)
	}
	if b.node.Stats().ReusedRemote == 0 {
		t.Fatalf("b's stream did not go through a: %+v", b.node.Stats())
	}
	shut := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		shut <- a.node.Shutdown(ctx)
	}()
	// B's other requests while A drains: they wait for the key's one
	// connection, which is A's and busy, and must end well.
	var wg sync.WaitGroup
	var failed atomic.Int64
	errs := make(chan string, 16)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 3 {
				ctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
				r, err := get(t, ctx, b.tr, u.url("/cl"))
				if err != nil {
					cancel()
					failed.Add(1)
					select {
					case errs <- err.Error():
					default:
					}
					continue
				}
				body, err := io.ReadAll(r.Body)
				r.Body.Close()
				cancel()
				if err != nil || string(body) != "hello world" {
					failed.Add(1)
					select {
					case errs <- fmt.Sprintf("body %q %v", body, err):
					default:
					}
				}
			}
		}()
	}
	time.Sleep(100 * time.Millisecond)
	g <- struct{}{}
	g <- struct{}{}
	rest, err := io.ReadAll(resp.Body)
	if err != nil || string(rest) != "chunk-1;chunk-2;" {
		wg.Wait()
		t.Fatalf("b's stream across a's Shutdown: %q %v", rest, err)
	}
	resp.Body.Close()
	select {
	case err := <-shut:
		if err != nil {
			t.Errorf("Shutdown: %v", err)
		}
	case <-time.After(10 * time.Second):
		wg.Wait()
		t.Fatal("a's Shutdown did not return")
	}
	a.pool.Close()
	wg.Wait()
	close(errs)
	if n := failed.Load(); n != 0 {
		var all []string
		for e := range errs {
			all = append(all, e)
		}
		t.Fatalf("%d of b's requests failed while a drained: %s", n, strings.Join(all, "; "))
	}
	r, err := get(t, context.Background(), b.tr, u.url("/cl"))
	if err != nil {
		t.Fatalf("after the reload: %v", err)
	}
	drain(r)
	b.node.Close()
	adv71cTableQuiet(t, obs, 3*time.Second)
}

// TestAdv71cCloseRacesRoundTrips: both nodes of a pair close while their
// Transports send requests, locally and through the unix leg. No RoundTrip
// hangs or panics; a response that came back reads whole or fails, never
// short; once Close has returned, RoundTrip fails with ErrClosed; and the
// table, read from a third process, is left with nothing live, reserved or
// in use.
func TestAdv71cCloseRacesRoundTrips(t *testing.T) {
	t.Run("h1", func(t *testing.T) {
		u := newTestUpstream(t)
		adv71cCloseRaces(t, u.url("/big?n=100000&cl=1"), u.url("/cl"), nil)
	})
	t.Run("h2c", func(t *testing.T) {
		s := newH2CServer(t, func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/big" {
				w.Header().Set("Content-Length", "100000")
				writePattern(w, 100000)
				return
			}
			io.WriteString(w, "hello world")
		}, 4)
		adv71cCloseRaces(t, s.url+"/big", s.url+"/cl", func(tr *Transport) { tr.H2C = true; tr.HTTP2 = true })
	})
}

func adv71cCloseRaces(t *testing.T, bigURL, smallURL string, more func(*Transport)) {
	spec := testSpec
	spec.Path = filepath.Join(t.TempDir(), "seg")
	conf := func(tr *Transport) {
		tr.MaxConnsPerKey = 2
		if more != nil {
			more(tr)
		}
	}
	owner := newMember(t, spec, conf)
	client := newMember(t, spec, conf)
	obs, err := orbitpool.Open(spec, orbitpool.Options{ReconcileInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer obs.Close()
	warm(t, owner, bigURL)

	stop := make(chan struct{})
	var wg sync.WaitGroup
	bad := make(chan string, 64)
	for i := range 8 {
		m := owner
		if i%2 == 1 {
			m = client
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				start := time.Now()
				r, err := get(t, ctx, m.tr, bigURL)
				if err == nil {
					b, rerr := io.ReadAll(r.Body)
					r.Body.Close()
					if rerr == nil && len(b) != 100000 {
						select {
						case bad <- fmt.Sprintf("short body %d read as whole", len(b)):
						default:
						}
					}
				}
				if took := time.Since(start); took > 4*time.Second {
					select {
					case bad <- fmt.Sprintf("exchange took %s (err %v)", took, err):
					default:
					}
				}
				cancel()
			}
		}()
	}
	time.Sleep(150 * time.Millisecond)
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		var cw sync.WaitGroup
		cw.Add(2)
		go func() { defer cw.Done(); owner.node.Close() }()
		go func() { defer cw.Done(); client.node.Close() }()
		cw.Wait()
	}()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		close(stop)
		t.Fatal("Close of both nodes did not return within 10s under load")
	}
	time.Sleep(50 * time.Millisecond)
	close(stop)
	waited := make(chan struct{})
	go func() { wg.Wait(); close(waited) }()
	select {
	case <-waited:
	case <-time.After(10 * time.Second):
		t.Fatal("RoundTrips did not return after Close")
	}
	close(bad)
	for s := range bad {
		t.Error(s)
	}
	for _, m := range []*member{owner, client} {
		_, err := get(t, context.Background(), m.tr, smallURL)
		if !errors.Is(err, ErrClosed) {
			t.Errorf("RoundTrip after Close: %v, want ErrClosed", err)
		}
		if n := m.node.Stats().OpenConns; n != 0 {
			t.Errorf("node %d holds %d connections after Close", m.pool.Lane(), n)
		}
		if n := m.node.open.Load() + m.node.dialing.Load(); n != 0 {
			t.Errorf("node %d counts %d connections open or dialing after Close", m.pool.Lane(), n)
		}
	}
	adv71cTableQuiet(t, obs, 3*time.Second)
}
