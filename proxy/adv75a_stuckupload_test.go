package proxy

import (
	"bufio"
	"context"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"
)

// adv75aEndless is an endless request body that counts its reads and
// records its Close.
type adv75aEndless struct {
	reads  atomic.Int64
	closed atomic.Bool
}

func (b *adv75aEndless) Read(p []byte) (int, error) {
	b.reads.Add(1)
	if b.closed.Load() {
		return 0, net.ErrClosed
	}
	clear(p)
	return len(p), nil
}

func (b *adv75aEndless) Close() error { b.closed.Store(true); return nil }

// TestAdv75aStuckUploadEndsCleanly: a POST with an endless body to an
// upstream that reads only the head and never the body, so every buffer on
// the way fills and the body's writer blocks. The exchange is then ended:
// the caller cancels (local path and through a sibling), or the owner's Node
// closes (through a sibling). RoundTrip returns in bounded time with an
// error; as with net/http, once it has returned nothing reads the request
// body any more, and the body has been closed; the next request gets its
// own answer.
func TestAdv75aStuckUploadEndsCleanly(t *testing.T) {
	for _, how := range []string{"local-cancel", "remote-cancel", "remote-ownerclose"} {
		t.Run(how, func(t *testing.T) {
			arrived := make(chan struct{}, 4)
			u := newAdv10Upstream(t, false, func(c net.Conn, br *bufio.Reader, req *http.Request, conn, n int) bool {
				if req.URL.Path == "/sink" {
					arrived <- struct{}{}
					// Never reads the body; held until the test ends
					// (t.Context is done before the cleanups run).
					<-t.Context().Done()
					return false
				}
				return adv10Fresh(c, req, conn, n)
			})
			var rt http.RoundTripper
			var owner *member
			if how == "local-cancel" {
				m := localTransportMember(t, u.conf(nil))
				warm(t, m, u.url("/warm"))
				rt = m.tr
			} else {
				var client *member
				owner, client = remotePair(t, u.conf(nil))
				warm(t, owner, u.url("/warm"))
				rt = client.tr
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			body := &adv75aEndless{}
			req, _ := http.NewRequestWithContext(ctx, "POST", u.url("/sink"), body)
			req.ContentLength = -1
			type result struct {
				resp *http.Response
				err  error
			}
			done := make(chan result, 1)
			go func() {
				resp, err := rt.RoundTrip(req)
				done <- result{resp, err}
			}()
			select {
			case <-arrived:
			case <-time.After(5 * time.Second):
				t.Fatal("the POST did not reach the upstream")
			}
			// Let the buffers on the way fill: the body's reads stop.
			waitFor(t, 10*time.Second, "the body's writer to block", func() bool {
				r := body.reads.Load()
				time.Sleep(100 * time.Millisecond)
				return r > 0 && body.reads.Load() == r
			})
			closed := make(chan error, 1)
			if how == "remote-ownerclose" {
				go func() { closed <- owner.node.Close() }()
			} else {
				cancel()
				closed <- nil
			}
			var r result
			select {
			case r = <-done:
			case <-time.After(10 * time.Second):
				t.Fatalf("%s: RoundTrip still blocked 10s after the exchange was ended", how)
			}
			if r.err == nil {
				r.resp.Body.Close()
				t.Fatalf("%s: a POST the upstream never answered got %d", how, r.resp.StatusCode)
			}
			after := body.reads.Load()
			time.Sleep(300 * time.Millisecond)
			if n := body.reads.Load(); n != after {
				t.Fatalf("%s: the request body was read %d more times after RoundTrip returned (%v)", how, n-after, r.err)
			}
			if !body.closed.Load() {
				t.Fatalf("%s: the request body was not closed after RoundTrip returned (%v)", how, r.err)
			}
			select {
			case <-closed:
			case <-time.After(10 * time.Second):
				t.Fatal("the owner's Close hung")
			}
			if how != "remote-ownerclose" {
				resp, b, err := adv10Do(t, rt, "GET", u.url("/next"), nil)
				adv10CheckOwn(t, "next", resp, b, err, "/next")
			}
		})
	}
}
