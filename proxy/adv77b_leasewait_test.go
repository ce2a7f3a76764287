package proxy

import (
	"context"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/governor"
)

// TestAdv77bLeaseWaitOwnerLeaves: the owner's one worker is held by its own
// exchange with another upstream, so siblings' leases of its idle
// connection to u (the fleet's only one, cap 1) wait on the owner for a
// worker (MaxLeaseWait 4s). The owner then leaves (Close, Close with the
// pool, or Shutdown with an 8s grace, as a reload gives): every waiting
// sibling request is served elsewhere with net/http's answer, well within
// its deadline and well before the lease wait would end (within 2s of the
// leave; Shutdown refuses new leases, so one still waiting for a worker
// should be refused, retry-safe, as the drain begins).
func TestAdv77bLeaseWaitOwnerLeaves(t *testing.T) {
	for _, withTLS := range []bool{false, true} {
		for _, how := range []string{"close", "closepool", "shutdown8s"} {
			name := "plain"
			if withTLS {
				name = "tls"
			}
			t.Run(name+"/"+how, func(t *testing.T) {
				release := make(chan struct{})
				held := newAdv10Upstream(t, false, adv77bScript(release, func() {}))
				u := newAdv10Upstream(t, withTLS, adv77bScript(nil, func() {}))
				var once sync.Once
				rel := func() { once.Do(func() { close(release) }) }
				t.Cleanup(rel)
				ref := adv77bRef(t, u)
				want := adv77bDo(ref, "GET", u.url("/"), nil, 0, nil, 5*time.Second)

				spec := testSpec
				spec.Path = t.TempDir() + "/seg"
				conf := u.conf(func(tr *Transport) { tr.MaxConnsPerKey = 1 })
				owner := newMemberOpts(t, spec, NodeOptions{SweepInterval: 50 * time.Millisecond, Governor: governor.New(1, 0), MaxLeaseWait: 4 * time.Second}, conf)
				client := newMember(t, spec, conf)
				third := newMember(t, spec, conf)
				warm(t, owner, u.url("/"))

				ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
				defer cancel()
				req, _ := http.NewRequestWithContext(ctx, "GET", held.url("/held"), nil)
				resp, err := owner.tr.RoundTrip(req)
				if err != nil {
					t.Fatalf("the owner's held request: %v", err)
				}
				defer resp.Body.Close()
				if _, err := io.ReadFull(resp.Body, make([]byte, 5)); err != nil {
					t.Fatalf("the held response: %v", err)
				}

				var wg sync.WaitGroup
				results := make(chan adv77bResult, 4)
				for _, m := range []*member{client, client, third, third} {
					wg.Add(1)
					go func() {
						defer wg.Done()
						results <- adv77bDo(m.tr, "GET", u.url("/"), nil, 0, nil, 10*time.Second)
					}()
				}
				time.Sleep(300 * time.Millisecond)
				leaveAt := time.Now()
				left := make(chan struct{})
				go func() {
					defer close(left)
					if how == "shutdown8s" {
						// A reload's grace period: long enough that the
						// owner's own exchange could end in it.
						sctx, scancel := context.WithTimeout(context.Background(), 8*time.Second)
						defer scancel()
						owner.node.Shutdown(sctx)
						return
					}
					adv77bLeave(owner, how)
				}()
				waited := make(chan struct{})
				go func() { wg.Wait(); close(waited) }()
				select {
				case <-waited:
				case <-time.After(12 * time.Second):
					t.Fatal("sibling requests hung as the owner left")
				}
				took := time.Since(leaveAt)
				t.Logf("served %v after the leave began", took)
				rel()
				close(results)
				fails := 0
				for r := range results {
					if r.err != nil {
						fails++
						if !adv77bClearErr(r.err) {
							t.Errorf("a waiting request failed unclearly: %v", r.err)
						}
						continue
					}
					adv77bSame(t, "a request waiting on the owner's worker", r, want)
				}
				if fails != 0 {
					t.Errorf("%d of 4 requests failed as the owner left (%s); net/http served all", fails, how)
				}
				if took > 2*time.Second {
					t.Errorf("the requests waiting on the leaving owner were served %v after it began to leave; want them moved at once, not after the lease wait", took.Round(time.Millisecond))
				}
				select {
				case <-left:
				case <-time.After(10 * time.Second):
					t.Fatal("the owner's leave hung")
				}
			})
		}
	}
}
