package proxy

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/orbitpool"
)

// TestAdv68cSiblingIdleBeforeUnpooled: a process whose own lane is full
// takes a sibling's idle connection to the upstream (LocalFirst) rather than
// dialing one outside the table.
func TestAdv68cSiblingIdleBeforeUnpooled(t *testing.T) {
	spec := orbitpool.PoolSpec{Lanes: 2, Keys: 4, ResourcesPerLane: 2, Path: filepath.Join(t.TempDir(), "seg")}
	rel := make(chan struct{})
	defer close(rel)
	closed := make(chan bool, 8)
	u1 := unpooledUpstream(t, rel, closed)
	u2 := newTestUpstream(t).url("")
	a := newMember(t, spec, nil)
	b := newMember(t, spec, nil)
	// a has an idle connection to u2.
	resp, err := a.tr.RoundTrip(adv68cReq(t, "GET", u2+"/x", nil))
	if err != nil {
		t.Fatal(err)
	}
	drain(resp)
	holdStreams(t, b, u1, 2) // b's lane is full
	_, _, err = adv10Do(t, b.tr, "GET", u2+"/x", nil)
	if err != nil {
		t.Fatalf("b to u2: %v", err)
	}
	if s := b.node.Stats(); s.Unpooled != 0 || s.ReusedRemote != 1 {
		t.Fatalf("b stats %+v: want a's idle connection used, nothing unpooled", s)
	}
}

func adv68cReq(t *testing.T, method, url string, body io.Reader) *http.Request {
	t.Helper()
	r, err := http.NewRequest(method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestAdv68cExpectContinueUnpooled: with the table full, a POST with
// Expect: 100-continue is served on an unpooled connection both when the
// upstream says 100 and reads the body, and when it refuses with 417 without
// reading it (the body is then not sent); each connection is closed.
func TestAdv68cExpectContinueUnpooled(t *testing.T) {
	spec := orbitpool.PoolSpec{Lanes: 1, Keys: 4, ResourcesPerLane: 2}
	release := make(chan struct{})
	defer close(release)
	closed := make(chan string, 8)
	url := rawUpstream(t, func(c net.Conn, br *bufio.Reader, req *http.Request) bool {
		switch req.URL.Path {
		case "/stream":
			io.WriteString(c, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n")
			<-release
			return false
		case "/continue":
			io.WriteString(c, "HTTP/1.1 100 Continue\r\n\r\n")
			b, _ := io.ReadAll(req.Body)
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: "+adv68cItoa(len(b))+"\r\n\r\n"+string(b))
		case "/refuse":
			io.WriteString(c, "HTTP/1.1 417 Expectation Failed\r\nContent-Length: 0\r\n\r\n")
		}
		c.SetReadDeadline(time.Now().Add(3 * time.Second))
		n, err := io.Copy(io.Discard, br)
		if err == nil {
			closed <- req.URL.Path + " closed, stray " + adv68cItoa(int(n))
		} else {
			closed <- req.URL.Path + " NOT closed"
		}
		return false
	})
	m := newMember(t, spec, func(tr *Transport) { tr.ExpectContinueTimeout = 2 * time.Second })
	holdStreams(t, m, url, 2)
	for _, c := range []struct{ path, want string }{{"/continue", "200 payload"}, {"/refuse", "417 "}} {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		req, _ := http.NewRequestWithContext(ctx, "POST", url+c.path, strings.NewReader("payload"))
		req.Header.Set("Expect", "100-continue")
		resp, err := m.tr.RoundTrip(req)
		if err != nil {
			cancel()
			t.Fatalf("%s: %v", c.path, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		cancel()
		// The exchange ends with the body sent: then its connection is
		// kept outside the table (see spares), or closed.
		waitFor(t, 2*time.Second, c.path+" over", func() bool { return m.node.spares.len() == 1 || m.node.open.Load() == 2 })
		m.tr.CloseIdleConnections()
		if got := adv68cItoa(resp.StatusCode) + " " + string(b); got != c.want {
			t.Fatalf("%s: %q, want %q", c.path, got, c.want)
		}
		// After a 417 the body still goes, as net/http sends it on a
		// connection it keeps; what matters is the close.
		if got := <-closed; !strings.HasPrefix(got, c.path+" closed") {
			t.Fatalf("%s: upstream: %s", c.path, got)
		}
	}
	if s := m.node.Stats(); s.Unpooled != 2 {
		t.Fatalf("stats %+v", s)
	}
	waitFor(t, 2*time.Second, "open back", func() bool { return m.node.open.Load() == 2 })
}

// TestAdv68cShutdownDuringUnpooled: Shutdown while an unpooled stream is
// open returns (it waits only for siblings' exchanges) and the stream still
// ends cleanly.
func TestAdv68cShutdownDuringUnpooled(t *testing.T) {
	spec := orbitpool.PoolSpec{Lanes: 1, Keys: 4, ResourcesPerLane: 2}
	release, closed := make(chan struct{}), make(chan bool, 4)
	url := unpooledUpstream(t, release, closed)
	m := newMember(t, spec, nil)
	holdStreams(t, m, url, 2)
	resp, err := m.tr.RoundTrip(adv68cReq(t, "GET", url+"/stream", nil))
	if err != nil || m.node.Stats().Unpooled != 1 {
		t.Fatalf("%v %+v", err, m.node.Stats())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- m.node.Shutdown(ctx) }()
	time.Sleep(50 * time.Millisecond)
	close(release)
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "first" && err == nil {
		t.Fatalf("unpooled stream during shutdown: %q %v", b, err)
	}
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Shutdown hung")
	}
	waitFor(t, 3*time.Second, "open 0", func() bool { return m.node.open.Load() == 0 })
}

func adv68cItoa(n int) string { return strconv.Itoa(n) }
