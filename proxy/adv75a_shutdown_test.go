package proxy

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestAdv75aOwnerShutdownMidExchangeCompletes: Shutdown drains: a sibling's
// exchange already under way on the owner's connection runs to its end.
// Mid-response-body (length, chunked, close-delimited) the sibling reads the
// whole body without error; mid-request-body the POST gets its answer. The
// upstream is released a moment after Shutdown begins, well within its
// context.
func TestAdv75aOwnerShutdownMidExchangeCompletes(t *testing.T) {
	const first = 100
	const rest = 5000
	for _, path := range []string{"/cl", "/chunked", "/close", "/upload"} {
		t.Run(path[1:], func(t *testing.T) {
			arrived := make(chan struct{}, 4)
			u, rel := adv75aHeldUpstream(t, first, rest, func(c net.Conn, req *http.Request) (bool, bool) {
				if req.URL.Path != "/upload" {
					return false, false
				}
				arrived <- struct{}{}
				got, err := io.ReadAll(req.Body)
				if err != nil {
					return false, true
				}
				fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%d", len(fmt.Sprint(len(got))), len(got))
				return true, true
			})
			owner, client := remotePair(t, nil)
			warm(t, owner, u.url("/warm"))
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			// The upload's body holds its rest back as the upstream
			// holds a response's.
			gate := make(chan struct{})
			var gated atomic.Bool
			open := func() {
				if gated.CompareAndSwap(false, true) {
					close(gate)
				}
			}
			t.Cleanup(open)
			shut := make(chan error, 1)
			shutdown := func() {
				go func() {
					sctx, scancel := context.WithTimeout(context.Background(), 8*time.Second)
					defer scancel()
					shut <- owner.node.Shutdown(sctx)
				}()
				time.AfterFunc(300*time.Millisecond, func() { rel(); open() })
			}
			var body []byte
			var rerr error
			if path == "/upload" {
				req, _ := http.NewRequestWithContext(ctx, "POST", u.url(path), &adv75aGatedBody{
					first: bytes.Repeat([]byte("f"), first), rest: bytes.Repeat([]byte("r"), rest), gate: gate, closed: make(chan struct{})})
				req.ContentLength = first + rest
				type result struct {
					resp *http.Response
					err  error
				}
				done := make(chan result, 1)
				go func() {
					resp, err := client.tr.RoundTrip(req)
					done <- result{resp, err}
				}()
				select {
				case <-arrived:
				case <-time.After(5 * time.Second):
					t.Fatal("the POST did not reach the upstream")
				}
				time.Sleep(50 * time.Millisecond)
				shutdown()
				var r result
				select {
				case r = <-done:
				case <-time.After(15 * time.Second):
					t.Fatal("the POST hung")
				}
				if r.err != nil {
					t.Fatalf("a POST under way when the owner began Shutdown failed: %v", r.err)
				}
				body, rerr = io.ReadAll(r.resp.Body)
				r.resp.Body.Close()
				if rerr != nil || string(body) != fmt.Sprint(first+rest) {
					t.Fatalf("POST answered %q, %v; want %d (the whole body delivered)", body, rerr, first+rest)
				}
			} else {
				req, _ := http.NewRequestWithContext(ctx, "GET", u.url(path), nil)
				resp, err := client.tr.RoundTrip(req)
				if err != nil {
					t.Fatalf("RoundTrip: %v", err)
				}
				defer resp.Body.Close()
				buf := make([]byte, first)
				if _, err := io.ReadFull(resp.Body, buf); err != nil {
					t.Fatalf("reading the first bytes: %v", err)
				}
				shutdown()
				got := make(chan struct{})
				go func() {
					body, rerr = io.ReadAll(resp.Body)
					close(got)
				}()
				select {
				case <-got:
				case <-time.After(15 * time.Second):
					t.Fatal("the body read hung")
				}
				if rerr != nil || len(body) != rest {
					t.Fatalf("a response under way when the owner began Shutdown: %d of %d remaining bytes, %v", len(body), rest, rerr)
				}
			}
			if owner.node.Stats().ServedRemote == 0 {
				t.Fatal("the request did not go through the owner")
			}
			select {
			case err := <-shut:
				_ = err
			case <-time.After(15 * time.Second):
				t.Fatal("Shutdown hung")
			}
		})
	}
}

// TestAdv75aOwnerStopsWithSiblingTunnel: a sibling's upgraded exchange (101,
// a tunnel through the owner to the upstream) is open when the owner shuts
// down with a short context. Shutdown returns in bounded time; afterwards
// the sibling's tunnel either still echoes or fails: it never hangs, half
// dead. The tunnel's upstream connection never serves another request.
func TestAdv75aOwnerStopsWithSiblingTunnel(t *testing.T) {
	u := newAdv10Upstream(t, false, func(c net.Conn, br *bufio.Reader, req *http.Request, conn, n int) bool {
		if req.URL.Path == "/ws" {
			io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: test\r\nConnection: Upgrade\r\n\r\n")
			buf := make([]byte, 512)
			for {
				k, err := br.Read(buf)
				if k > 0 {
					if _, werr := c.Write(buf[:k]); werr != nil {
						return false
					}
				}
				if err != nil {
					return false
				}
			}
		}
		return adv10Fresh(c, req, conn, n)
	})
	owner, client := remotePair(t, nil)
	warm(t, owner, u.url("/warm"))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", u.url("/ws"), nil)
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "test")
	resp, err := client.tr.RoundTrip(req)
	if err != nil {
		t.Fatalf("upgrade: %v", err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("status %d, want 101", resp.StatusCode)
	}
	rw, ok := resp.Body.(io.ReadWriteCloser)
	if !ok {
		t.Fatalf("the 101's body is a %T, not writable", resp.Body)
	}
	defer rw.Close()
	echo := func(msg string) error {
		type res struct {
			s   string
			err error
		}
		ch := make(chan res, 1)
		go func() {
			if _, err := io.WriteString(rw, msg); err != nil {
				ch <- res{"", err}
				return
			}
			b := make([]byte, len(msg))
			_, err := io.ReadFull(rw, b)
			ch <- res{string(b), err}
		}()
		select {
		case r := <-ch:
			if r.err == nil && r.s != msg {
				return fmt.Errorf("echo %q, got %q", msg, r.s)
			}
			if r.err != nil {
				return r.err
			}
			return nil
		case <-time.After(8 * time.Second):
			rw.Close()
			<-ch
			return fmt.Errorf("hang")
		}
	}
	if err := echo("hello"); err != nil {
		t.Fatalf("tunnel before Shutdown: %v", err)
	}
	start := time.Now()
	sctx, scancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	serr := owner.node.Shutdown(sctx)
	scancel()
	if d := time.Since(start); d > 8*time.Second {
		t.Fatalf("Shutdown with a 500ms context took %v (err %v)", d, serr)
	}
	if err := echo("again"); err != nil && err.Error() == "hang" {
		t.Fatal("the sibling's tunnel hangs after the owner stopped: neither relayed nor closed")
	}
	rw.Close()
	// The client's next request gets its own answer, on a connection that
	// is not the tunnel's.
	resp2, body, err := adv10Do(t, client.tr, "GET", u.url("/next"), nil)
	adv10CheckOwn(t, "GET after the tunnel", resp2, body, err, "/next")
	if !strings.Contains(body, " r1 ") {
		t.Fatalf("/next answered %q: not on a fresh connection", body)
	}
}
