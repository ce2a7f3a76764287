package proxy

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/orbitpool"
)

// TestAdv77dShutdownDrainsHalfSentUpload: a sibling's upload is half sent
// through the owner (its writer waiting in a slow body) when the owner's
// Shutdown begins with time enough to drain. Shutdown lets the exchange
// run to its end: the upload completes, the sibling gets the whole echo,
// the upstream sees the request once; Shutdown returns after it, no
// exchange is left active, no Read or Close of the body comes after
// resp.Body.Close returned, and the sibling's next request is served on a
// connection of its own. Plain and TLS.
func TestAdv77dShutdownDrainsHalfSentUpload(t *testing.T) {
	for _, useTLS := range []bool{false, true} {
		t.Run(fmt.Sprintf("tls=%v", useTLS), func(t *testing.T) {
			up := newAdv77dUp(t, useTLS)
			spec := orbitpool.PoolSpec{Lanes: 4, Keys: 8, ResourcesPerLane: 16, Path: filepath.Join(t.TempDir(), "seg")}
			conf := func(tr *Transport) {
				tr.MaxConnsPerKey = 1
				tr.TLSClientConfig = up.cc
			}
			owner := newMember(t, spec, conf)
			client := newMember(t, spec, conf)
			if r := adv77bDo(owner.tr, "GET", up.url+"/warm", nil, 0, nil, 5*time.Second); r.err != nil || r.body != "ok" {
				t.Fatalf("warm: %v", r)
			}
			const size = 64 << 10
			body := newAdv77dBody(size, 1024)
			defer body.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, "POST", up.url+"/echo", body)
			req.ContentLength = size
			done := make(chan adv77dRT, 1)
			go func() {
				resp, err := client.tr.RoundTrip(req)
				done <- adv77dRT{resp, err}
			}()
			waitFor(t, 5*time.Second, "the upload to be under way through the owner", func() bool {
				return up.count("/echo") == 1 && owner.node.srv.active.Load() == 1
			})
			shut := make(chan error, 1)
			go func() {
				sctx, scancel := context.WithTimeout(context.Background(), 8*time.Second)
				defer scancel()
				shut <- owner.node.Shutdown(sctx)
			}()
			time.Sleep(100 * time.Millisecond)
			body.letFlow()
			var r adv77dRT
			select {
			case r = <-done:
			case <-time.After(10 * time.Second):
				body.Close()
				t.Fatal("RoundTrip did not return")
			}
			if r.err != nil {
				t.Fatalf("the upload failed though Shutdown had time to drain it: %v", r.err)
			}
			b, err := io.ReadAll(r.resp.Body)
			r.resp.Body.Close()
			body.markDone()
			if err != nil || string(b) != strings.Repeat("x", size) {
				t.Errorf("echo: %d bytes, %v; want %d", len(b), err, size)
			}
			select {
			case <-shut:
			case <-time.After(10 * time.Second):
				t.Fatal("Shutdown hung")
			}
			if n := up.count("/echo"); n != 1 {
				t.Errorf("the upstream received the upload %d times", n)
			}
			if a := owner.node.srv.active.Load(); a != 0 {
				t.Errorf("%d exchanges active after Shutdown", a)
			}
			time.Sleep(200 * time.Millisecond)
			if n, c, a := body.lateReads.Load(), body.lateCloses.Load(), body.readAtDone.Load(); n+c+a != 0 {
				t.Errorf("req.Body touched after resp.Body.Close returned: %d reads began, %d closes, %d under way", n, c, a)
			}
			want := "after"
			if r := adv77bDo(client.tr, "POST", up.url+"/echo", strings.NewReader(want), int64(len(want)), nil, 5*time.Second); r.err != nil || r.body != want {
				t.Errorf("next request from the sibling: %v", r)
			}
			req2, _ := http.NewRequest("GET", up.url, nil)
			_, key, _ := client.tr.Upstream(req2)
			closeIdleUntilGone(t, key, 5*time.Second, client)
		})
	}
}
