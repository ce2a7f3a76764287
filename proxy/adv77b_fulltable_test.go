package proxy

import (
	"context"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/orbitpool"
)

// TestAdv77bFullTableOwnerLeaves: each process's table holds one
// connection. The client's holds its own busy connection to other; the
// owner's holds the only connection to u, busy with the client's held
// exchange through the hop. Three more requests of the client to u pause
// (its table is full, u's connection busy). The owner leaves (Close,
// Shutdown, Close with the pool), u's held response is released, then
// other's. The held exchange through the hop ends whole (under Close, or a
// clear *Error); every paused request is served with net/http's answer
// within its own 8s deadline: none hangs, none fails, none reads another
// response's bytes.
func TestAdv77bFullTableOwnerLeaves(t *testing.T) {
	for _, withTLS := range []bool{false, true} {
		for _, how := range adv77bHow {
			name := "plain"
			if withTLS {
				name = "tls"
			}
			t.Run(name+"/"+how, func(t *testing.T) {
				relU, relO := make(chan struct{}), make(chan struct{})
				u := newAdv10Upstream(t, withTLS, adv77bScript(relU, func() {}))
				other := newAdv10Upstream(t, false, adv77bScript(relO, func() {}))
				var onceU, onceO sync.Once
				releaseU := func() { onceU.Do(func() { close(relU) }) }
				releaseO := func() { onceO.Do(func() { close(relO) }) }
				t.Cleanup(releaseU)
				t.Cleanup(releaseO)
				ref := adv77bRef(t, u)
				want := adv77bDo(ref, "GET", u.url("/"), nil, 0, nil, 5*time.Second)

				spec := orbitpool.PoolSpec{Lanes: 2, Keys: 32, ResourcesPerLane: 1, Path: filepath.Join(t.TempDir(), "seg")}
				conf := u.conf(func(tr *Transport) { tr.MaxConnsPerKey = 1 })
				owner, client := newMember(t, spec, conf), newMember(t, spec, conf)
				warm(t, owner, u.url("/"))

				ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
				defer cancel()
				hold := func(url string) *http.Response {
					t.Helper()
					req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
					resp, err := client.tr.RoundTrip(req)
					if err != nil {
						t.Fatalf("held request to %s: %v", url, err)
					}
					t.Cleanup(func() { resp.Body.Close() })
					if _, err := io.ReadFull(resp.Body, make([]byte, 5)); err != nil {
						t.Fatalf("held response from %s: %v", url, err)
					}
					return resp
				}
				ho := hold(other.url("/held"))
				hu := hold(u.url("/held"))
				if owner.node.Stats().ServedRemote == 0 {
					t.Fatal("the client's held request to u did not go through the owner")
				}

				const n = 3
				var wg sync.WaitGroup
				results := make(chan adv77bResult, n)
				for range n {
					wg.Add(1)
					go func() {
						defer wg.Done()
						results <- adv77bDo(client.tr, "GET", u.url("/"), nil, 0, nil, 8*time.Second)
					}()
				}
				time.Sleep(300 * time.Millisecond)
				left := make(chan struct{})
				go func() { adv77bLeave(owner, how); close(left) }()
				time.Sleep(100 * time.Millisecond)
				releaseU()
				rest, rerr := io.ReadAll(hu.Body)
				switch {
				case rerr == nil && string(rest) == "last":
				case rerr != nil && how != "shutdown" && adv77bClearErr(rerr) && !strings.Contains(string(rest), "ok"):
				default:
					t.Errorf("the held exchange through the hop as the owner left (%s): rest %q, %v; want \"last\"", how, rest, rerr)
				}
				time.Sleep(200 * time.Millisecond)
				releaseO()
				if rest, err := io.ReadAll(ho.Body); err != nil || string(rest) != "last" {
					t.Errorf("the client's own held exchange: rest %q, %v", rest, err)
				}
				ho.Body.Close()
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
						t.Logf("a paused request failed: %v", r.err)
						continue
					}
					adv77bSame(t, "a paused request", r, want)
				}
				if fails != 0 {
					t.Errorf("%d of %d paused requests failed as the owner left (%s); net/http served all", fails, n, how)
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
