package proxy

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/orbitpool"
	"golang.org/x/sys/unix"
)

const advBig = 1<<20 + 123

// advUpstream answers each path in its own adversarial way; conns counts the
// connections it accepted.
func advUpstream(t *testing.T, conns *atomic.Int32) string {
	body := randomBytes(advBig)
	hdr := func(extra string) string {
		return "HTTP/1.1 200 OK\r\nContent-Length: " + strconv.Itoa(advBig) + "\r\n" + extra + "\r\n"
	}
	return rawUpstream(t, func(c net.Conn, br *bufio.Reader, req *http.Request) bool {
		io.Copy(io.Discard, req.Body)
		switch req.URL.Path {
		case "/warm":
			conns.Add(1)
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nwarm")
		case "/extra":
			// A second, unsolicited response in the same write as the body.
			var b bytes.Buffer
			b.WriteString(hdr(""))
			b.Write(body)
			b.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nEVIL!")
			c.Write(b.Bytes())
		case "/extra-late":
			c.Write(append([]byte(hdr("")), body...))
			time.Sleep(5 * time.Millisecond)
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nEVIL!")
		case "/http10":
			c.Write(append([]byte(strings.Replace(hdr(""), "HTTP/1.1", "HTTP/1.0", 1)), body...))
		case "/close":
			c.Write(append([]byte(hdr("Connection: close\r\n")), body...))
		case "/early":
			io.WriteString(c, "HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n")
			time.Sleep(2 * time.Millisecond)
			c.Write(append([]byte(hdr("")), body...))
		case "/head":
			// HEAD: a length, no body.
			io.WriteString(c, hdr(""))
		case "/nocontent":
			io.WriteString(c, "HTTP/1.1 204 No Content\r\nContent-Length: "+strconv.Itoa(advBig)+"\r\n\r\n")
		case "/notmod":
			io.WriteString(c, "HTTP/1.1 304 Not Modified\r\nContent-Length: "+strconv.Itoa(advBig)+"\r\n\r\n")
		case "/big":
			c.Write(append([]byte(hdr("")), body...))
		default:
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfresh")
		}
		return true
	})
}

func advDo(t *testing.T, rt http.RoundTripper, method, url string) ([]byte, *http.Response, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, method, url, nil)
	resp, err := rt.RoundTrip(req)
	if err != nil {
		return nil, nil, err
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	return b, resp, err
}

// TestAdvSpliceFraming: every adversarial response shape through the
// owner's splice path: the body is byte-exact, and the next exchange on
// the key gets its own response.
func TestAdvSpliceFraming(t *testing.T) {
	want := randomBytes(advBig)
	for _, tc := range []struct {
		path, method string
		body         bool
	}{
		{"/extra", "GET", true},
		{"/extra-late", "GET", true},
		{"/http10", "GET", true},
		{"/close", "GET", true},
		{"/early", "GET", true},
		{"/head", "HEAD", false},
		{"/nocontent", "GET", false},
		{"/notmod", "GET", false},
		{"/big", "GET", true},
	} {
		t.Run(tc.path[1:], func(t *testing.T) {
			var conns atomic.Int32
			base := advUpstream(t, &conns)
			owner, client := remotePair(t, nil)
			warm(t, owner, base+"/warm")
			for i := range 3 {
				got, _, err := advDo(t, client.tr, tc.method, base+tc.path)
				if err != nil {
					t.Fatalf("%d: %v", i, err)
				}
				if tc.body && !bytes.Equal(got, want) {
					t.Fatalf("%d: body differs: %d bytes", i, len(got))
				}
				if !tc.body && len(got) != 0 {
					t.Fatalf("%d: %d body bytes", i, len(got))
				}
				time.Sleep(20 * time.Millisecond)
				for j := range 2 {
					got, _, err = advDo(t, client.tr, "GET", base+"/next")
					if err != nil || string(got) != "fresh" {
						t.Fatalf("%d/%d: next: %.40q, %v", i, j, got, err)
					}
				}
			}
		})
	}
}

// stallUpstream sends the head and part of a large body, then stalls until
// the test ends; it reports each connection's close on closed.
func stallUpstream(t *testing.T, closed chan<- struct{}) string {
	return rawUpstream(t, func(c net.Conn, br *bufio.Reader, req *http.Request) bool {
		if req.URL.Path != "/stall" {
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nwarm")
			return true
		}
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: "+strconv.Itoa(advBig)+"\r\n\r\n")
		c.Write(randomBytes(200 << 10))
		// Wait for the owner to close.
		c.SetReadDeadline(time.Now().Add(20 * time.Second))
		io.Copy(io.Discard, c)
		closed <- struct{}{}
		return false
	})
}

// TestAdvSpliceStallDeadline: an upstream that stalls mid-body under the
// sibling's deadline: the sibling's read fails near the deadline and the
// owner closes the upstream connection soon after.
func TestAdvSpliceStallDeadline(t *testing.T) {
	for _, mode := range []string{"deadline", "cancel"} {
		t.Run(mode, func(t *testing.T) {
			closed := make(chan struct{}, 4)
			base := stallUpstream(t, closed)
			owner, client := remotePair(t, nil)
			warm(t, owner, base+"/warm")
			ctx, cancel := context.WithTimeout(context.Background(), 400*time.Millisecond)
			defer cancel()
			if mode == "cancel" {
				ctx, cancel = context.WithCancel(context.Background())
				time.AfterFunc(400*time.Millisecond, cancel)
			}
			start := time.Now()
			resp, err := get(t, ctx, client.tr, base+"/stall")
			if err != nil {
				t.Fatal(err)
			}
			n, err := io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if err == nil {
				t.Fatalf("read %d bytes with no error", n)
			}
			if d := time.Since(start); d > 2*time.Second {
				t.Fatalf("body read ended after %v", d)
			}
			select {
			case <-closed:
			case <-time.After(3 * time.Second):
				t.Fatal("the owner kept the stalled upstream connection open")
			}
			waitFor(t, 2*time.Second, "open conns 0", func() bool { return owner.node.Stats().OpenConns == 0 })
			// The fleet still works.
			resp, err = get(t, context.Background(), client.tr, base+"/warm")
			if err != nil {
				t.Fatal(err)
			}
			drain(resp)
		})
	}
}

// remoteOnlyPolicy is LocalFirst that never creates: the sibling's every
// request goes through an owner's connection.
type remoteOnlyPolicy struct{}

func (remoteOnlyPolicy) Decide(v *orbitpool.View) orbitpool.Decision {
	d := orbitpool.LocalFirst{}.Decide(v)
	if d.Action == orbitpool.ActionCreate {
		return orbitpool.Decision{Action: orbitpool.ActionWait, Reason: orbitpool.ReasonPolicy}
	}
	return d
}

// pipeCount counts this process's pipe descriptors.
func pipeCount(t *testing.T) int {
	es, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range es {
		if l, _ := os.Readlink("/proc/self/fd/" + e.Name()); strings.HasPrefix(l, "pipe:") {
			n++
		}
	}
	return n
}

// TestAdvSpliceNoFdLeak: spliced exchanges that succeed, are cut short, or
// whose sibling goes, leave no pipe behind.
func TestAdvSpliceNoFdLeak(t *testing.T) {
	var conns atomic.Int32
	base := advUpstream(t, &conns)
	short := rawUpstream(t, func(c net.Conn, br *bufio.Reader, req *http.Request) bool {
		if req.URL.Path == "/warm" {
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nwarm")
			return true
		}
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: "+strconv.Itoa(advBig)+"\r\n\r\n")
		c.Write(randomBytes(300 << 10))
		c.Close()
		return false
	})
	owner, client := remotePair(t, func(tr *Transport) {})
	client.tr.Policy = remoteOnlyPolicy{}
	before := pipeCount(t)
	for range 20 {
		warm(t, owner, base+"/warm")
		if b, _, err := advDo(t, client.tr, "GET", base+"/big"); err != nil || len(b) != advBig {
			t.Fatalf("big: %d bytes, %v", len(b), err)
		}
		warm(t, owner, short+"/warm")
		if _, _, err := advDo(t, client.tr, "GET", short+"/x"); err == nil {
			t.Fatal("short body read whole")
		}
		ctx, cancel := context.WithCancel(context.Background())
		resp, err := get(t, ctx, client.tr, base+"/big")
		if err == nil {
			io.CopyN(io.Discard, resp.Body, 100<<10)
			cancel()
			resp.Body.Close()
		}
		cancel()
	}
	if st := owner.node.Stats(); st.SplicedBodies < 20 {
		t.Fatalf("only %d bodies spliced", st.SplicedBodies)
	}
	time.Sleep(200 * time.Millisecond)
	if after := pipeCount(t); after != before {
		t.Fatalf("%d pipes before, %d after", before, after)
	}
}

// TestAdvCreateBeforeRemoteBudget: large-body requests from every member of
// a fleet at once never open more upstream connections than the key's
// budget, nor dial more at once than MaxDialingPerKey, and all succeed.
func TestAdvCreateBeforeRemoteBudget(t *testing.T) {
	const maxConns = 2
	var accepted, open, maxOpen atomic.Int32
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{
		Handler: http.HandlerFunc(echoBody),
		ConnState: func(c net.Conn, s http.ConnState) {
			switch s {
			case http.StateNew:
				accepted.Add(1)
				if n := open.Add(1); n > maxOpen.Load() {
					maxOpen.Store(n)
				}
			case http.StateClosed, http.StateHijacked:
				open.Add(-1)
			}
		},
	}
	go srv.Serve(ln)
	defer srv.Close()
	url := "http://" + ln.Addr().String() + "/echo"
	ms := newFleet(t, 3, func(tr *Transport) {
		tr.MaxConnsPerKey = maxConns
		tr.MaxDialingPerKey = 1
	})
	body := randomBytes(largeBody + 7)
	errs := make(chan error, 64)
	done := make(chan struct{})
	n := 0
	for _, m := range ms {
		for range 6 {
			n++
			go func() {
				defer func() { done <- struct{}{} }()
				for range 4 {
					ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
					req, _ := http.NewRequestWithContext(ctx, "POST", url, bytes.NewReader(body))
					resp, err := m.tr.RoundTrip(req)
					if err != nil {
						cancel()
						errs <- err
						return
					}
					got, err := io.ReadAll(resp.Body)
					resp.Body.Close()
					cancel()
					if err != nil || !bytes.Equal(got, body) {
						errs <- err
						return
					}
				}
			}()
		}
	}
	for range n {
		<-done
	}
	close(errs)
	for err := range errs {
		t.Errorf("request failed: %v", err)
	}
	if a, mo := accepted.Load(), maxOpen.Load(); a > maxConns || mo > maxConns {
		t.Errorf("%d connections accepted, at most %d open at once; budget %d", a, mo, maxConns)
	}
}

// lowestFreeFd is the number the next descriptor this process opens gets.
func lowestFreeFd(t *testing.T) uint64 {
	es, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	used := map[uint64]bool{}
	for _, e := range es {
		n, _ := strconv.ParseUint(e.Name(), 10, 64)
		used[n] = true
	}
	// ReadDir's own descriptor is closed by now.
	var fd uint64
	for used[fd] {
		fd++
	}
	return fd
}

// TestAdvSpliceAtFdLimit: an owner with no descriptor to spare for a pipe
// relays a sibling's large body by copying it, as it relays a small one:
// the exchange needs no new descriptor, so it must not fail for want of one.
func TestAdvSpliceAtFdLimit(t *testing.T) {
	t.Run("copied", func(t *testing.T) {
		defer func(v int64) { spliceMinBody = v }(spliceMinBody)
		spliceMinBody = 1 << 62
		testSpliceAtFdLimit(t)
	})
	t.Run("spliced", testSpliceAtFdLimit)
}

func testSpliceAtFdLimit(t *testing.T) {
	var conns atomic.Int32
	base := advUpstream(t, &conns)
	owner, client := remotePair(t, nil)
	client.tr.Policy = remoteOnlyPolicy{}
	warm(t, owner, base+"/warm")
	// The sibling's stream to the owner, kept for the next exchange.
	if got, _, err := advDo(t, client.tr, "GET", base+"/next"); err != nil || string(got) != "fresh" {
		t.Fatalf("first: %q %v", got, err)
	}
	want := randomBytes(advBig)
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	saved := lim
	runtime.GC()
	lim.Cur = lowestFreeFd(t)
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	// Fill whatever holes are left below the limit.
	var fill []int
	for {
		fd, err := unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			break
		}
		fill = append(fill, fd)
	}
	got, _, err := advDo(t, client.tr, "GET", base+"/big")
	unix.Setrlimit(unix.RLIMIT_NOFILE, &saved)
	for _, fd := range fill {
		unix.Close(fd)
	}
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("at the descriptor limit: %d of %d bytes, %v", len(got), advBig, err)
	}
	if st := owner.node.Stats(); st.ServedRemote != 2 {
		t.Fatalf("not served by the owner: %+v", st)
	}
}

// TestAdvSpliceEarlyResponse: the upstream answers a sibling's large
// upload with a large body before reading the upload, and keeps its
// connection: the body reaches the sibling whole, and the next exchanges
// on the key get their own responses.
func TestAdvSpliceEarlyResponse(t *testing.T) {
	want := randomBytes(advBig)
	base := rawUpstream(t, func(c net.Conn, br *bufio.Reader, req *http.Request) bool {
		if req.URL.Path == "/early" {
			c.Write(append([]byte("HTTP/1.1 200 OK\r\nContent-Length: "+strconv.Itoa(advBig)+"\r\n\r\n"), want...))
		} else {
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfresh")
		}
		// Read the upload only after answering.
		io.Copy(io.Discard, req.Body)
		return true
	})
	owner, client := remotePair(t, nil)
	client.tr.Policy = remoteOnlyPolicy{}
	for i := range 5 {
		warm(t, owner, base+"/warm")
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		req, _ := http.NewRequestWithContext(ctx, "POST", base+"/early", bytes.NewReader(randomBytes(512<<10)))
		resp, err := client.tr.RoundTrip(req)
		if err != nil {
			cancel()
			t.Fatalf("%d: %v", i, err)
		}
		got, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		cancel()
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("%d: %d bytes, %v", i, len(got), err)
		}
		// The owner may have closed the connection (the upload was still
		// going out when the response ended): it dials again if so.
		warm(t, owner, base+"/warm")
		if got, _, err := advDo(t, client.tr, "GET", base+"/next"); err != nil || string(got) != "fresh" {
			t.Fatalf("%d: next: %.40q %v", i, got, err)
		}
	}
	if st := owner.node.Stats(); st.SplicedBodies == 0 {
		t.Fatalf("nothing spliced: %+v", st)
	}
}

// TestAdvSpliceConcurrent: members reading bodies at once, spliced when a
// sibling's connection serves them, some giving up partway, over a key with
// two connections: every body read whole is byte-exact.
func TestAdvSpliceConcurrent(t *testing.T) {
	var conns atomic.Int32
	base := advUpstream(t, &conns)
	spec := testSpec
	spec.Path = filepath.Join(t.TempDir(), "seg")
	conf := func(tr *Transport) { tr.MaxConnsPerKey = 2 }
	owner := newMember(t, spec, conf)
	var clients []*member
	for range 2 {
		clients = append(clients, newMember(t, spec, conf))
	}
	// Two owner connections.
	done := make(chan struct{})
	for range 2 {
		go func() {
			defer func() { done <- struct{}{} }()
			req, _ := http.NewRequest("GET", base+"/big", nil)
			if resp, err := owner.tr.RoundTrip(req); err == nil {
				drain(resp)
			}
		}()
	}
	<-done
	<-done
	want := randomBytes(advBig)
	errs := make(chan string, 100)
	for w := range 6 {
		go func() {
			defer func() { done <- struct{}{} }()
			c := clients[w%2]
			for i := range 8 {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				req, _ := http.NewRequestWithContext(ctx, "GET", base+"/big", nil)
				resp, err := c.tr.RoundTrip(req)
				if err != nil {
					cancel()
					continue // a connection cut by another's abandon
				}
				if (w+i)%3 == 0 {
					io.CopyN(io.Discard, resp.Body, int64(w+1)*50<<10)
					resp.Body.Close()
					cancel()
					continue
				}
				got, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				cancel()
				if err == nil && !bytes.Equal(got, want) {
					errs <- "body differs"
				}
			}
		}()
	}
	for range 6 {
		<-done
	}
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	var spliced uint64
	for _, m := range append(clients, owner) {
		spliced += m.node.Stats().SplicedBodies
	}
	if spliced == 0 {
		t.Error("nothing spliced")
	}
}
