package proxy

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestAdv77bPausedOwnerLeaves: a key's fleet-wide cap is one connection,
// the owner's, busy with a held chunked response (the owner's own request,
// or a sibling's through the hop). Two siblings' requests (three each)
// pause for room. The owner then leaves (Close, Shutdown, Close with the
// pool) and the held response is released. Every paused request is served
// elsewhere with net/http's answer ("ok") within its own 8s deadline: none
// hangs, none fails, none reads another response's bytes. The held
// exchange ends whole (under Close, or under Shutdown when it is the owner's
// own, which Shutdown does not drain, it may fail with a clear *Error).
func TestAdv77bPausedOwnerLeaves(t *testing.T) {
	for _, withTLS := range []bool{false, true} {
		for _, how := range adv77bHow {
			for _, holder := range []string{"owner", "sibling"} {
				name := "plain"
				if withTLS {
					name = "tls"
				}
				t.Run(name+"/"+how+"/"+holder, func(t *testing.T) {
					release := make(chan struct{})
					u := newAdv10Upstream(t, withTLS, adv77bScript(release, func() {}))
					var once sync.Once
					rel := func() { once.Do(func() { close(release) }) }
					t.Cleanup(rel)
					ref := adv77bRef(t, u)
					want := adv77bDo(ref, "GET", u.url("/"), nil, 0, nil, 5*time.Second)
					ms := newFleet(t, 3, u.conf(func(tr *Transport) { tr.MaxConnsPerKey = 1 }))
					owner, client, third := ms[0], ms[1], ms[2]
					warm(t, owner, u.url("/"))

					hm := owner
					if holder == "sibling" {
						hm = client
					}
					ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
					defer cancel()
					req, _ := http.NewRequestWithContext(ctx, "GET", u.url("/held"), nil)
					resp, err := hm.tr.RoundTrip(req)
					if err != nil {
						t.Fatalf("the held request: %v", err)
					}
					defer resp.Body.Close()
					first := make([]byte, 5)
					if _, err := io.ReadFull(resp.Body, first); err != nil || string(first) != "first" {
						t.Fatalf("the held response's first bytes: %q, %v", first, err)
					}
					if holder == "sibling" && owner.node.Stats().ServedRemote == 0 {
						t.Fatal("the sibling's held request did not go through the owner")
					}

					const each = 3
					var wg sync.WaitGroup
					results := make(chan adv77bResult, 2*each)
					start := time.Now()
					for _, m := range []*member{client, third} {
						for range each {
							wg.Add(1)
							go func() {
								defer wg.Done()
								results <- adv77bDo(m.tr, "GET", u.url("/"), nil, 0, nil, 8*time.Second)
							}()
						}
					}
					time.Sleep(300 * time.Millisecond)
					left := make(chan struct{})
					go func() { adv77bLeave(owner, how); close(left) }()
					time.Sleep(100 * time.Millisecond)
					rel()
					rest, rerr := io.ReadAll(resp.Body)
					switch {
					case rerr == nil && string(rest) == "last":
					case rerr != nil && (how != "shutdown" || holder == "owner") && adv77bClearErr(rerr) && !strings.Contains(string(rest), "ok"):
					default:
						t.Errorf("the held exchange as the owner left (%s): rest %q, %v; want \"last\"", how, rest, rerr)
					}
					waited := make(chan struct{})
					go func() { wg.Wait(); close(waited) }()
					select {
					case <-waited:
					case <-time.After(12 * time.Second):
						t.Fatal("paused requests hung past their deadline as the owner left")
					}
					close(results)
					fails := 0
					for r := range results {
						if r.err != nil {
							fails++
							if !adv77bClearErr(r.err) {
								t.Errorf("a paused request failed unclearly: %v", r.err)
							}
							continue
						}
						adv77bSame(t, "a paused request", r, want)
					}
					if fails != 0 {
						t.Errorf("%d of %d paused requests failed after %v as the owner left (%s); net/http served all", fails, 2*each, time.Since(start).Round(time.Millisecond), how)
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
}
