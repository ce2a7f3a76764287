package proxy

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestAdv10StaleStreamToRestartedOwner: the owner a sibling keeps an idle
// stream to leaves (Shutdown, as on a reload or upgrade, or Close, as on a
// crash's aftermath) and a new process joins in its lane, listening on the
// same socket path, and makes the key's one connection. The sibling's
// next request, a POST whose body cannot be replayed, is planned on the new
// owner's connection and meets the stale stream first: it is sent again on
// a fresh stream, reaches the upstream exactly once, and gets its own
// answer; the stale stream never carries it to anyone.
func TestAdv10StaleStreamToRestartedOwner(t *testing.T) {
	for _, how := range []string{"shutdown", "close"} {
		t.Run(how, func(t *testing.T) {
			u := newAdv10Upstream(t, false, func(c net.Conn, br *bufio.Reader, req *http.Request, conn, n int) bool {
				if req.URL.Path == "/sink" {
					k, _ := io.Copy(io.Discard, req.Body)
					body := fmt.Sprintf("c%d r%d got %d", conn, n, k)
					fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
					return true
				}
				return adv10Fresh(c, req, conn, n)
			})
			spec := testSpec
			spec.Path = filepath.Join(t.TempDir(), "seg")
			one := func(tr *Transport) { tr.MaxConnsPerKey = 1 }
			owner := newMember(t, spec, one)
			client := newMember(t, spec, one)
			lane := owner.pool.Lane()
			warm(t, owner, u.url("/warm"))
			resp, body, err := adv10Do(t, client.tr, "GET", u.url("/first"), nil)
			adv10CheckOwn(t, "first sibling request", resp, body, err, "/first")
			if s := client.node.Stats(); s.IdlePeerConns != 1 || s.ReusedRemote != 1 {
				t.Fatalf("no idle stream to the owner: %+v", s)
			}
			if how == "shutdown" {
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				owner.node.Shutdown(ctx)
				cancel()
			} else {
				owner.node.Close()
			}
			owner.pool.Close()
			next := newMember(t, spec, one)
			if next.pool.Lane() != lane {
				t.Skipf("the new member joined lane %d, not the old owner's %d", next.pool.Lane(), lane)
			}
			warm(t, next, u.url("/warm2"))
			if s := client.node.Stats(); s.IdlePeerConns != 1 {
				t.Fatalf("the stale stream is not in the pool any more: %+v", s)
			}
			const size = 64 << 10
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			resp, err = client.tr.RoundTrip(postNoReplay(t, u.url("/sink"), size).WithContext(ctx))
			if err != nil {
				t.Fatalf("POST after the owner's restart: %v\nsibling %+v\nnew owner %+v", err, client.node.Stats(), next.node.Stats())
			}
			b, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil || !strings.HasSuffix(string(b), fmt.Sprintf("got %d", size)) {
				t.Fatalf("POST: %q %v", b, err)
			}
			var posts int
			for _, r := range u.requests() {
				if strings.HasSuffix(r, "POST /sink") {
					posts++
				}
			}
			if posts != 1 {
				t.Errorf("the upstream read the POST %d times: %q", posts, u.requests())
			}
			if s := next.node.Stats(); s.ServedRemote != 1 {
				t.Errorf("the new owner served %d of the sibling's requests, want the POST: %+v", s.ServedRemote, s)
			}
			if n := u.conns.Load(); n != 2 {
				t.Errorf("%d upstream connections, want 2 (one per owner)", n)
			}
		})
	}
}
