package proxy

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/governor"
	"github.com/orbitproxy/orbit/orbitpool"
)

// adv68cUpstream serves scripted shapes on plain TCP. After each shape it
// reports on closed whether the proxy closed the connection (EOF within
// 3s), except /stream (held) and the 101 shapes.
func adv68cUpstream(t *testing.T, release chan struct{}, closed chan string) string {
	t.Helper()
	waitEOF := func(c net.Conn, br *bufio.Reader, path string) {
		c.SetReadDeadline(time.Now().Add(3 * time.Second))
		_, err := io.Copy(io.Discard, br)
		if err == nil {
			closed <- path
		} else {
			closed <- path + ": NOT CLOSED: " + err.Error()
		}
	}
	return rawUpstream(t, func(c net.Conn, br *bufio.Reader, req *http.Request) bool {
		p := req.URL.Path
		switch p {
		case "/stream":
			io.WriteString(c, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n")
			<-release
			io.WriteString(c, "0\r\n\r\n")
			return false
		case "/partial":
			io.WriteString(c, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n")
		case "/head":
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n")
		case "/204":
			io.WriteString(c, "HTTP/1.1 204 No Content\r\n\r\n")
		case "/304":
			io.WriteString(c, "HTTP/1.1 304 Not Modified\r\nContent-Length: 10\r\n\r\n")
		case "/closehdr":
			io.WriteString(c, "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok")
		case "/extra":
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokHTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nbad")
		case "/cut":
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nok")
			c.(*net.TCPConn).CloseWrite()
		case "/slowhead":
			// answers nothing: the header timeout or the caller ends it
		case "/early":
			// answers before reading a body that never ends
			io.WriteString(c, "HTTP/1.1 413 Too Large\r\nContent-Length: 2\r\n\r\nno")
		case "/sink":
			io.Copy(io.Discard, req.Body)
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		case "/ws":
			io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
			c.SetReadDeadline(time.Now().Add(3 * time.Second))
			_, err := io.Copy(c, br)
			if err == nil {
				closed <- p
			} else {
				closed <- p + ": NOT CLOSED: " + err.Error()
			}
			return false
		case "/wsup":
			io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
			c.Close()
			closed <- p
			return false
		default:
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}
		waitEOF(c, br, p)
		return false
	})
}

type adv68cErrBody struct{ n int }

func (b *adv68cErrBody) Read(p []byte) (int, error) {
	if b.n > 0 {
		return 0, errors.New("client went away")
	}
	b.n++
	return copy(p, "abc"), nil
}
func (b *adv68cErrBody) Close() error { return nil }

// endless is a request body that never ends until its context does.
type adv68cEndless struct{ ctx context.Context }

func (b adv68cEndless) Read(p []byte) (int, error) {
	select {
	case <-b.ctx.Done():
		return 0, b.ctx.Err()
	case <-time.After(time.Millisecond):
	}
	return copy(p, strings.Repeat("x", 512)), nil
}
func (adv68cEndless) Close() error { return nil }

// TestAdv68cUnpooledEndsClean: with the table full, every way an unpooled
// exchange can end (body closed early, context cancelled mid-body, HEAD, 204,
// 304, Connection: close, stray bytes after the response, a short body, a
// header timeout, an early answer to an endless body, a request body that
// fails, a panicking trace hook, a 101 closed by either side) closes its
// connection (the upstream reads EOF), gives back its admission count
// (n.open returns to the held 2), its worker, and its goroutines; and under
// an admission ceiling just above the held connections, 30 rounds are never
// refused as not admitted.
func TestAdv68cUnpooledEndsClean(t *testing.T) {
	spec := orbitpool.PoolSpec{Lanes: 1, Keys: 4, ResourcesPerLane: 2}
	release, closed := make(chan struct{}), make(chan string, 64)
	url := adv68cUpstream(t, release, closed)
	gov := governor.New(4, 0)
	m := newMemberOpts(t, spec, NodeOptions{SweepInterval: 50 * time.Millisecond, Admission: governor.NewAdmission(3), Governor: gov},
		func(tr *Transport) { tr.ResponseHeaderTimeout = 200 * time.Millisecond })
	held := holdStreams(t, m, url, 2)
	defer func() {
		close(release)
		for _, r := range held {
			io.ReadAll(r.Body)
			r.Body.Close()
		}
	}()
	time.Sleep(100 * time.Millisecond)
	base := runtime.NumGoroutine()

	expectClosed := func(t *testing.T, path string) {
		t.Helper()
		select {
		case got := <-closed:
			if got != path {
				t.Fatalf("upstream reported %q, want %q closed", got, path)
			}
		case <-time.After(6 * time.Second):
			t.Fatalf("%s: upstream never reported", path)
		}
	}
	settle := func(t *testing.T, what string) {
		t.Helper()
		waitFor(t, 3*time.Second, what+": open back to the 2 held", func() bool {
			return m.node.open.Load() == 2 && m.node.dialing.Load() == 0
		})
	}
	rounds := 0
	do := func(t *testing.T, method, path string, mut func(*http.Request), use func(*http.Response, context.CancelFunc) error, wantErr bool) {
		t.Helper()
		rounds++
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, method, url+path, nil)
		if mut != nil {
			mut(req)
		}
		resp, err := func() (r *http.Response, err error) {
			defer func() {
				if p := recover(); p != nil {
					err = errors.New("panicked")
				}
			}()
			return m.tr.RoundTrip(req)
		}()
		if err != nil {
			if errors.Is(err, ErrNotAdmitted) {
				t.Fatalf("%s %s refused as not admitted: the admission count leaked", method, path)
			}
			if !wantErr {
				t.Fatalf("%s %s: %v", method, path, err)
			}
		} else {
			if uerr := use(resp, cancel); uerr != nil {
				t.Fatalf("%s %s: %v", method, path, uerr)
			}
		}
		m.tr.CloseIdleConnections() // a connection kept outside the table too
	}
	readAll := func(resp *http.Response, _ context.CancelFunc) error {
		_, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		return err
	}
	type exchange struct {
		name, method, path string
		mut                func(*http.Request)
		use                func(*http.Response, context.CancelFunc) error
		wantErr            bool
	}
	upgrade := func(r *http.Request) {
		r.Header.Set("Connection", "Upgrade")
		r.Header.Set("Upgrade", "echo")
	}
	exchanges := []exchange{
		{name: "once", method: "GET", path: "/once", use: readAll},
		{name: "partial close", method: "GET", path: "/partial", use: func(resp *http.Response, _ context.CancelFunc) error {
			b := make([]byte, 5)
			io.ReadFull(resp.Body, b)
			return resp.Body.Close()
		}},
		{name: "partial cancel", method: "GET", path: "/partial", use: func(resp *http.Response, cancel context.CancelFunc) error {
			b := make([]byte, 5)
			io.ReadFull(resp.Body, b)
			cancel()
			_, err := io.ReadAll(resp.Body)
			if err == nil {
				return errors.New("the body ended cleanly after cancel")
			}
			resp.Body.Close()
			return nil
		}},
		{name: "HEAD", method: "HEAD", path: "/head", use: readAll},
		{name: "204", method: "GET", path: "/204", use: readAll},
		{name: "304", method: "GET", path: "/304", use: readAll},
		{name: "closehdr", method: "GET", path: "/closehdr", use: readAll},
		{name: "extra", method: "GET", path: "/extra", use: func(resp *http.Response, _ context.CancelFunc) error {
			b, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if string(b) != "ok" {
				return errors.New("body " + string(b))
			}
			return err
		}},
		{name: "cut", method: "GET", path: "/cut", use: func(resp *http.Response, _ context.CancelFunc) error {
			_, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err == nil {
				return errors.New("a short body read clean")
			}
			return nil
		}},
		{name: "slowhead", method: "GET", path: "/slowhead", use: readAll, wantErr: true},
		{name: "early", method: "POST", path: "/early", mut: func(r *http.Request) {
			ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
			t.Cleanup(cancel)
			*r = *r.WithContext(ctx)
			r.Body = adv68cEndless{ctx}
		}, use: readAll, wantErr: true},
		{name: "body error", method: "POST", path: "/sink", mut: func(r *http.Request) {
			r.Body = &adv68cErrBody{}
			r.ContentLength = 100
		}, use: readAll, wantErr: true},
		{name: "trace panic", method: "GET", path: "/once", mut: func(r *http.Request) {
			tr := &httptrace.ClientTrace{GotFirstResponseByte: func() { panic("hook") }}
			*r = *r.WithContext(httptrace.WithClientTrace(r.Context(), tr))
		}, use: readAll, wantErr: true},
		// A 101 closed by the client.
		{name: "ws", method: "GET", path: "/ws", mut: upgrade, use: func(resp *http.Response, _ context.CancelFunc) error {
			rw := resp.Body.(io.ReadWriteCloser)
			io.WriteString(rw, "ping")
			b := make([]byte, 4)
			if _, err := io.ReadFull(rw, b); err != nil {
				return err
			}
			return rw.Close()
		}},
		// A 101 closed by the upstream.
		{name: "wsup", method: "GET", path: "/wsup", mut: upgrade, use: func(resp *http.Response, _ context.CancelFunc) error {
			b, _ := io.ReadAll(resp.Body)
			if len(b) != 0 {
				return errors.New("bytes in a closed tunnel")
			}
			return resp.Body.Close()
		}},
	}
	for range 3 {
		for _, x := range exchanges {
			do(t, x.method, x.path, x.mut, x.use, x.wantErr)
			expectClosed(t, x.path)
			settle(t, x.name)
		}
	}
	if s := m.node.Stats(); s.Unpooled < uint64(rounds)-3 || s.DialsNotAdmitted != 0 {
		t.Fatalf("stats %+v after %d rounds", s, rounds)
	}
	if gov.Outstanding() != 2 {
		// the two held streams
		t.Fatalf("governor: %d workers in use, want the 2 held", gov.Outstanding())
	}
	waitFor(t, 5*time.Second, "goroutines back", func() bool { return runtime.NumGoroutine() <= base+2 })
}
