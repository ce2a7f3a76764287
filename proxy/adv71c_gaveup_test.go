package proxy

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/governor"
)

// TestAdv71cGaveUpWhileWaitingForWorkerNotSent: a sibling's request waits
// on its owner for a worker of the owner's budget, and its caller gives up
// (context cancelled) before one comes free: the sibling closes its stream.
// When a worker comes free afterwards, the owner must not send the
// abandoned request upstream (nobody reads its answer, and a POST's body
// is gone with the stream), as a caller's own cancelled wait sends
// nothing: the stream it came on is closed, which the owner can see before
// it takes the connection up.
func TestAdv71cGaveUpWhileWaitingForWorkerNotSent(t *testing.T) {
	for _, method := range []string{"GET", "POST"} {
		t.Run(method, func(t *testing.T) {
			var late atomic.Int32
			base := rawUpstream(t, func(c net.Conn, br *bufio.Reader, req *http.Request) bool {
				if req.URL.Path == "/late" {
					late.Add(1)
				}
				io.Copy(io.Discard, req.Body)
				io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
				return true
			})
			gov := governor.New(1, 0)
			owner, client := budgetFleet(t, NodeOptions{Governor: gov, MaxLeaseWait: 3 * time.Second},
				func(tr *Transport) { tr.MaxConnsPerKey = 1 })
			warm(t, owner, base+"/warm")
			held := gov.Acquire()
			var once sync.Once
			release := func() { once.Do(held.Release) }
			defer release()

			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var body io.Reader
			if method == "POST" {
				body = stringsReader("payload")
			}
			req, _ := http.NewRequestWithContext(ctx, method, base+"/late", body)
			errc := make(chan error, 1)
			go func() {
				resp, err := client.tr.RoundTrip(req)
				if err == nil {
					drain(resp)
				}
				errc <- err
			}()
			waitFor(t, 3*time.Second, "the request to wait on the owner", func() bool { return client.node.Stats().ReusedRemote == 1 })
			time.Sleep(50 * time.Millisecond)
			cancel()
			select {
			case err := <-errc:
				if !errors.Is(err, context.Canceled) {
					t.Errorf("cancelled request: %v, want context.Canceled", err)
				}
			case <-time.After(5 * time.Second):
				release()
				t.Fatal("the cancelled request did not return")
			}
			// The sibling's stream is closed now; the worker comes free.
			time.Sleep(50 * time.Millisecond)
			release()
			time.Sleep(300 * time.Millisecond)
			if n := late.Load(); n != 0 {
				t.Fatalf("the upstream got the %s its caller had given up on (closed its stream) before the owner had a worker for it (%d times)", method, n)
			}
		})
	}
}

type stringsReaderT struct {
	s string
	i int
}

func stringsReader(s string) io.Reader { return &stringsReaderT{s: s} }

func (r *stringsReaderT) Read(p []byte) (int, error) {
	if r.i >= len(r.s) {
		return 0, io.EOF
	}
	n := copy(p, r.s[r.i:])
	r.i += n
	return n, nil
}
