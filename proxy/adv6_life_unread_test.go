package proxy

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// postOnce is a POST with a short body of declared length and no GetBody:
// not replayable by method, sent in the write of its head.
func postOnce(url, body string) *http.Request {
	req, _ := http.NewRequest("POST", url, io.NopCloser(strings.NewReader(body)))
	req.ContentLength = int64(len(body))
	return req
}

// TestAdv6LifeKilledOwnerUnreadPOSTRetried: the owner process is stopped
// (SIGSTOP), a sibling sends a POST on a stream to it, and the owner is then
// killed -9 without ever reading it. The kernel tells the sibling so: the
// stream ends with ECONNRESET, which a unix stream reports only when its
// peer closed with bytes of ours unread, and the sibling wrote nothing after
// the request. Nothing of the POST can have reached the upstream; the
// sibling must send it on a plan of its own instead of failing it (stock
// Caddy, with no owner in between, serves it). Both with a stream the
// sibling kept idle and with one it dials (queued, never accepted).
func TestAdv6LifeKilledOwnerUnreadPOSTRetried(t *testing.T) {
	for _, tc := range []struct {
		name          string
		idle, bigHead bool
	}{
		{"idle-stream", true, false},
		{"fresh-stream", false, false},
		// A head larger than the stream's buffer: the write itself
		// fails, with part of the request taken by the kernel.
		{"big-head", true, true},
	} {
		idle := tc.idle
		t.Run(tc.name, func(t *testing.T) {
			u := newHangUpstream(t)
			close(u.release)
			seg := filepath.Join(t.TempDir(), "seg")
			owner := startChild(t, seg, u.srv.URL, 0, 1)
			owner.send(t, "warm 1")
			if got := owner.expect(t, "warmed"); got != "1" {
				t.Fatalf("owner made %s connections", got)
			}
			spec := testSpec
			spec.Path = seg
			me := newMember(t, spec, func(tr *Transport) { tr.MaxConnsPerKey = 1 })
			if idle {
				if r := <-sendAsync(me.tr, postOnce(u.srv.URL+"/hang", "first")); r.err != nil || r.body != "ok" {
					t.Fatalf("first POST through the owner: %q, %v", r.body, r.err)
				}
				if st := me.node.Stats(); st.ReusedRemote != 1 || st.IdlePeerConns != 1 {
					t.Fatalf("the first POST did not leave an idle stream to the owner: %+v", st)
				}
			}
			stopped := false
			if err := owner.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
			stopped = true
			waitStopped(t, owner.cmd.Process.Pid)
			defer func() {
				if stopped {
					owner.cmd.Process.Signal(syscall.SIGKILL)
				}
			}()
			before := me.node.Stats().ReusedRemote
			req := postOnce(u.srv.URL+"/hang", "once")
			if tc.bigHead {
				req.Header.Set("X-Big", strings.Repeat("b", 600<<10))
			}
			done := sendAsync(me.tr, req)
			waitFor(t, 5*time.Second, "the POST to go to the stopped owner", func() bool { return me.node.Stats().ReusedRemote == before+1 })
			time.Sleep(100 * time.Millisecond) // its frame is written right after the lease
			if err := owner.cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			owner.cmd.Wait()
			stopped = false
			select {
			case r := <-done:
				if r.err != nil || r.body != "ok" {
					t.Fatalf("a POST the killed owner never read failed instead of going another way: %q, %v", r.body, r.err)
				}
			case <-time.After(12 * time.Second):
				t.Fatal("the POST hung")
			}
			if n := u.count("POST once"); n != 1 {
				t.Fatalf("the upstream saw the POST %d times", n)
			}
		})
	}
}

// TestAdv6LifeCloseUnreadPOSTRetried: Node.Close (no drain) on an owner
// whose stream to a sibling sits between two exchanges, the sibling's next
// POST written on it and unread. Close closes the stream; nothing of the
// POST went anywhere, and the sibling must serve it another way. Close is
// held (its stream goroutine paused) with the owner's connection still in
// the table and its socket gone: the sibling's later attempts must keep off
// that owner, rather than spend every retry dialing a socket that is not
// there, and be served once the connection leaves the table. A GET, which
// the sibling replays after any stream failure, shows the second part alone.
func TestAdv6LifeCloseUnreadPOSTRetried(t *testing.T) {
	for _, method := range []string{"POST", "GET"} {
		t.Run(method, func(t *testing.T) { closeUnreadRetried(t, method) })
	}
}

func closeUnreadRetried(t *testing.T, method string) {
	po := pauseOwnerAfterPOST(t)
	u, owner, client := po.u, po.owner, po.client
	second, key := postOnce(u.srv.URL+"/hang", "two"), "POST two"
	if method == "GET" {
		second, _ = http.NewRequest("GET", u.srv.URL+"/hang", nil)
		key = "GET "
	}
	done := sendAsync(client.tr, second)
	waitFor(t, 2*time.Second, "the second request to take the stream", func() bool { return client.node.Stats().IdlePeerConns == 0 })
	time.Sleep(50 * time.Millisecond)

	closed := make(chan error, 1)
	go func() { closed <- owner.node.Close() }()
	waitServerClosed(t, owner)
	// The owner's connection stays in the table while Close is held.
	var early *roundTripResult
	select {
	case r := <-done:
		early = &r
	case <-time.After(300 * time.Millisecond):
	}
	po.resume()
	if early == nil {
		select {
		case r := <-done:
			early = &r
		case <-time.After(8 * time.Second):
			t.Fatal("the second request hung")
		}
	}
	if early.err != nil || early.body != "ok" {
		t.Fatalf("a %s the closing owner never read failed: %q, %v", method, early.body, early.err)
	}
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("Close hung")
	}
	if n := u.count(key); n != 1 {
		t.Fatalf("the upstream saw the second %s %d times", method, n)
	}
}

// waitStopped waits until every thread of process pid is stopped.
func waitStopped(t *testing.T, pid int) {
	t.Helper()
	waitFor(t, 5*time.Second, "the owner to stop", func() bool {
		dir := fmt.Sprintf("/proc/%d/task", pid)
		tasks, err := os.ReadDir(dir)
		if err != nil || len(tasks) == 0 {
			return false
		}
		for _, e := range tasks {
			b, err := os.ReadFile(dir + "/" + e.Name() + "/stat")
			if err != nil {
				return false
			}
			// pid (comm) S ...: the state follows the last ')'.
			i := strings.LastIndexByte(string(b), ')')
			if i < 0 || i+2 >= len(b) || (b[i+2] != 'T' && b[i+2] != 't') {
				return false
			}
		}
		return true
	})
}
