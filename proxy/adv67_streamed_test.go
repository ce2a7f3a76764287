package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/governor"
)

// TestAdv67EndedWaitClosesAStreamedBody: over HTTP/1.1 and h2c upstreams,
// a POST whose body streams (a pipe, no length: it waits for the owner's
// accept) is refused by a busy owner and its watcher ends the wait:
// RoundTrip returns the refusal behind the context's error, promptly, and
// the body is closed (the writer's next Write fails), and the owner's
// connection is not left taken: once the owner's worker is free, the
// sibling's next request is served.
func TestAdv67EndedWaitClosesAStreamedBody(t *testing.T) {
	answer := func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		fmt.Fprint(w, n)
	}
	for _, proto := range []string{"http1", "h2c"} {
		t.Run(proto, func(t *testing.T) {
			var url string
			var conf func(*Transport)
			if proto == "h2c" {
				url, conf = newH2CServer(t, answer).url, h2cConf
			} else {
				u := newTestUpstream(t)
				url = u.url("/echo")
			}
			spec := testSpec
			spec.Path = filepath.Join(t.TempDir(), "seg")
			gov := governor.New(1, 0)
			c := func(tr *Transport) {
				tr.MaxConnsPerKey = 1
				if conf != nil {
					conf(tr)
				}
			}
			owner := newMemberOpts(t, spec, NodeOptions{Governor: gov, MaxLeaseWait: 100 * time.Millisecond, SweepInterval: 50 * time.Millisecond}, c)
			client := newMember(t, spec, c)
			warm(t, owner, url)
			held := gov.Acquire()

			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			w := &recordWaits{retry: cancel}
			pr, pw := io.Pipe()
			go pw.Write([]byte("first"))
			req, _ := http.NewRequestWithContext(WithWaitWatcher(ctx, w), "POST", url, pr)
			start := time.Now()
			resp, err := client.tr.RoundTrip(req)
			if err == nil {
				drain(resp)
				held.Release()
				t.Fatalf("setup: served (watcher told %q)", w.got())
			}
			if !errors.Is(err, ErrOwnerBusy) || !errors.Is(err, context.Canceled) {
				t.Errorf("error %v: want ErrOwnerBusy behind context.Canceled (watcher told %q)", err, w.got())
			}
			if d := time.Since(start); d > 2*time.Second {
				t.Errorf("RoundTrip took %v", d)
			}
			done := make(chan error, 1)
			go func() { _, err := pw.Write([]byte("more")); done <- err }()
			select {
			case werr := <-done:
				if werr == nil {
					t.Errorf("a Write to the body succeeded after RoundTrip returned")
				}
			case <-time.After(time.Second):
				t.Errorf("the body was not closed: a Write to it blocks after RoundTrip returned")
				pr.Close()
			}
			held.Release()
			ctx2, cancel2 := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel2()
			req2, _ := http.NewRequestWithContext(ctx2, "GET", url, nil)
			resp, err = client.tr.RoundTrip(req2)
			if err != nil {
				t.Fatalf("the next request: %v (client %+v, owner %+v)", err, client.node.Stats(), owner.node.Stats())
			}
			drain(resp)
		})
	}
}
