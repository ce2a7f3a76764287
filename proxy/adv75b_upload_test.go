package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// adv75bSlowBody yields n chunks of 1 KiB, one every gap.
type adv75bSlowBody struct {
	n   int
	gap time.Duration
	tag string
}

func (b *adv75bSlowBody) Read(p []byte) (int, error) {
	if b.n == 0 {
		return 0, io.EOF
	}
	time.Sleep(b.gap)
	b.n--
	c := strings.Repeat("x", 1023) + "\n"
	if b.n == 0 {
		c = b.tag + c[len(b.tag):]
	}
	return copy(p, c), nil
}

// TestAdv75bShutdownMidUpload: a sibling streams slow POST bodies (~1s
// each) through the owner's connections while the owner shuts down.
// With time to spare (10s), every upload completes with its own answer.
// With a short drain (100ms) uploads may fail, but each caller gets an
// error within its own deadline (plus slack), no POST reaches the upstream
// twice, and Shutdown returns soon after its ctx ends.
func TestAdv75bShutdownMidUpload(t *testing.T) {
	for _, tc := range []struct {
		name     string
		drain    time.Duration
		mustPass bool
	}{{"spare", 10 * time.Second, true}, {"short", 100 * time.Millisecond, false}} {
		t.Run(tc.name, func(t *testing.T) {
			u := newAdv75bUpstream(t, nil)
			owner, client := newFleetN(t, 2, func(tr *Transport) { tr.MaxConnsPerKey = 3 })
			// Three owner connections.
			var wg sync.WaitGroup
			for i := range 3 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					req, _ := http.NewRequest("POST", fmt.Sprintf("%s/?q=warm%d", u.srv.URL, i), &adv75bSlowBody{n: 5, gap: 20 * time.Millisecond, tag: "warm"})
					if resp, err := owner.tr.RoundTrip(req); err == nil {
						drain(resp)
					}
				}()
			}
			wg.Wait()
			type res struct {
				i   int
				err error
				got string
				d   time.Duration
			}
			const n = 3
			out := make(chan res, n)
			const deadline = 6 * time.Second
			for i := range n {
				go func() {
					ctx, cancel := context.WithTimeout(context.Background(), deadline)
					defer cancel()
					tag := fmt.Sprintf("up%d", i)
					req, _ := http.NewRequestWithContext(ctx, "POST", u.srv.URL+"/?q="+tag, &adv75bSlowBody{n: 50, gap: 20 * time.Millisecond, tag: tag})
					start := time.Now()
					resp, err := client.tr.RoundTrip(req)
					var got []byte
					if err == nil {
						got, err = io.ReadAll(resp.Body)
						resp.Body.Close()
					}
					out <- res{i, err, string(got), time.Since(start)}
				}()
			}
			// Until the uploads are under way on the owner.
			waitFor(t, 5*time.Second, "the uploads to reach the upstream", func() bool {
				return u.count("up0")+u.count("up1")+u.count("up2") >= 1
			})
			time.Sleep(200 * time.Millisecond)
			ctx, cancel := context.WithTimeout(context.Background(), tc.drain)
			start := time.Now()
			owner.node.Shutdown(ctx)
			cancel()
			if d := time.Since(start); d > tc.drain+5*time.Second {
				t.Errorf("Shutdown took %v with a drain of %v", d, tc.drain)
			}
			remote := client.node.Stats().ReusedRemote
			for range n {
				select {
				case r := <-out:
					tag := fmt.Sprintf("up%d", r.i)
					if r.d > deadline+5*time.Second {
						t.Errorf("upload %d returned after %v, past its deadline %v", r.i, r.d, deadline)
					}
					if r.err == nil && !strings.HasSuffix(r.got, ":"+tag) {
						t.Errorf("upload %d got another's answer: ...%q", r.i, r.got[max(0, len(r.got)-20):])
					}
					if tc.mustPass && r.err != nil {
						t.Errorf("upload %d failed though Shutdown had time to spare: %v (upstream saw it %d times)", r.i, r.err, u.count(tag))
					}
					if errors.Is(r.err, context.DeadlineExceeded) && tc.mustPass {
						t.Errorf("upload %d hit its deadline", r.i)
					}
				case <-time.After(deadline + 10*time.Second):
					t.Fatalf("an upload hung past its deadline")
				}
			}
			if d := u.dupPosts(); len(d) != 0 {
				t.Errorf("POSTs reached the upstream more than once: %v", d)
			}
			if remote == 0 {
				t.Errorf("no upload went through the owner")
			}
		})
	}
}

// newFleetN is newFleet returning the first two members.
func newFleetN(t *testing.T, n int, conf func(*Transport)) (*member, *member) {
	ms := newFleet(t, n, conf)
	return ms[0], ms[1]
}
