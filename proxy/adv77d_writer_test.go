package proxy

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/orbitpool"
)

// TestAdv77dWriterEndsAfterAnswer: the upstream reads a POST's declared
// 8 KiB and answers at once; the caller's body takes 300ms to report its
// end (the writer's read past the declared length, which net/http's
// writer makes to check the length). The answer comes before the writer
// is done, as from net/http (doc.go says so); the writer then ends by
// itself: it closes the body once and reads none after, and the connection
// serves the next request. Local path and remote hop, plain and TLS.
func TestAdv77dWriterEndsAfterAnswer(t *testing.T) {
	for _, useTLS := range []bool{false, true} {
		for _, remote := range []bool{false, true} {
			t.Run(fmt.Sprintf("tls=%v/remote=%v", useTLS, remote), func(t *testing.T) {
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
				subject := owner
				if remote {
					subject = client
				}
				before := owner.node.Stats().ServedRemote
				body := newAdv77dBody(8<<10, 8<<10)
				body.eofDelay = 300 * time.Millisecond
				defer body.Close()
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				req, _ := http.NewRequestWithContext(ctx, "POST", up.url+"/up", body)
				req.ContentLength = int64(body.size)
				resp, err := subject.tr.RoundTrip(req)
				if err != nil {
					t.Fatalf("RoundTrip: %v", err)
				}
				b, err := io.ReadAll(resp.Body)
				if err != nil || string(b) != "ok" {
					t.Fatalf("answer %q %v", b, err)
				}
				resp.Body.Close()
				body.markDone()
				if remote && owner.node.Stats().ServedRemote == before {
					t.Fatalf("setup: the request did not go through the owner")
				}
				waitFor(t, 3*time.Second, "the writer to close the body", func() bool { return body.lateCloses.Load() > 0 })
				reads := body.reads.Load()
				time.Sleep(100 * time.Millisecond)
				if c, r, in := body.lateCloses.Load(), body.reads.Load(), body.inRead.Load(); c != 1 || r != reads || in != 0 {
					t.Errorf("after the writer closed the body: %d closes (want 1), %d reads began after it, %d under way", c, r-reads, in)
				}
				// And the connection is not lost: the next request is served.
				if r := adv77bDo(subject.tr, "POST", up.url+"/echo", nil, 0, nil, 5*time.Second); r.err != nil || r.status != 200 {
					t.Errorf("next request: %v", r)
				}
			})
		}
	}
}
