package proxy

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// adv29BigUpstream serves /big: a body of 256 MiB, of declared length
// (spliced by the owner) or chunked (copied), written until the client stops
// reading; and /small: "ok".
func adv29BigUpstream(t *testing.T) string {
	t.Helper()
	buf := make([]byte, 64<<10)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/big" {
			w.Write([]byte("ok"))
			return
		}
		if r.URL.Query().Get("chunked") == "" {
			w.Header().Set("Content-Length", strconv.Itoa(256<<20))
		}
		for range (256 << 20) / len(buf) {
			if _, err := w.Write(buf); err != nil {
				return
			}
		}
	}))
	t.Cleanup(func() {
		srv.CloseClientConnections()
		srv.Close()
	})
	return srv.URL
}

// soleIdleConn is an owner and a client of one segment, with at most one
// connection per key, and the owner's one connection to an
// adv29BigUpstream (at base), idle after a warm-up.
func soleIdleConn(t *testing.T) (base string, owner, client *member, oc *owned) {
	t.Helper()
	base = adv29BigUpstream(t)
	spec := testSpec
	spec.Path = filepath.Join(t.TempDir(), "seg")
	conf := func(tr *Transport) { tr.MaxConnsPerKey = 1 }
	owner = newMember(t, spec, conf)
	client = newMember(t, spec, conf)
	if err := getBody(context.Background(), owner.tr, base+"/small"); err != nil {
		t.Fatalf("warm: %v", err)
	}
	if oc = lastOwned(owner); oc == nil {
		t.Fatal("warm left no idle connection")
	}
	return base, owner, client, oc
}

// TestAdv29PeerStopsReadingPastDeadline: a sibling sends a lease and a GET
// for a large response with a deadline 300ms away, and then never reads
// the stream. Its deadline is the owner's backstop ("the owner's backstop
// for a caller that can no longer say it has given up", watch.go): once it
// (plus ownerDeadlineGrace) has passed, the owner must end the exchange and
// give back what it holds for it (its worker, the exchange's goroutine, the
// upstream connection's unit), not sit forever in a write to a stream
// nobody reads.
func TestAdv29PeerStopsReadingPastDeadline(t *testing.T) {
	for _, chunked := range []bool{false, true} {
		t.Run(fmt.Sprintf("chunked=%v", chunked), func(t *testing.T) {
			base, owner, client, oc := soleIdleConn(t)
			deadline := time.Now().Add(300 * time.Millisecond)
			frame := leaseFrame(t, client, oc, deadline, 0)
			path := "/big"
			if chunked {
				path += "?chunked=1"
			}
			host := base[len("http://"):]
			frame = fmt.Appendf(frame, "GET %s HTTP/1.1\r\nHost: %s\r\n\r\n", path, host)
			c := dialOwner(t, owner)
			if _, err := c.Write(frame); err != nil {
				t.Fatal(err)
			}
			// Read the accept and the head, so that the exchange is
			// under way, and then nothing more.
			c.SetReadDeadline(time.Now().Add(2 * time.Second))
			br := bufio.NewReaderSize(c, 64)
			if _, err := br.Peek(respHeaderLen + 2); err != nil {
				t.Fatalf("no answer from the owner: %v", err)
			}
			c.SetReadDeadline(time.Time{})
			time.Sleep(time.Until(deadline.Add(ownerDeadlineGrace)))
			start := time.Now()
			for owner.node.srv.active.Load() != 0 {
				if time.Since(start) > 3*time.Second {
					t.Fatalf("the owner still runs the exchange of a peer that stopped reading %v after its deadline and grace (active %d)",
						time.Since(deadline.Add(ownerDeadlineGrace)).Round(time.Millisecond), owner.node.srv.active.Load())
				}
				time.Sleep(5 * time.Millisecond)
			}
		})
	}
}
