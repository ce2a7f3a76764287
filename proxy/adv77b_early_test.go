package proxy

import (
	"bytes"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// adv77bGated is a request body that gives its first part, then waits for
// gate (or 10s) before the rest: the upstream answers before the body is
// all sent.
type adv77bGated struct {
	first, rest *bytes.Reader
	gate        <-chan struct{}
}

func (g *adv77bGated) Read(p []byte) (int, error) {
	if g.first.Len() > 0 {
		return g.first.Read(p)
	}
	select {
	case <-g.gate:
	case <-time.After(10 * time.Second):
	}
	return g.rest.Read(p)
}

func newAdv77bGated(gate <-chan struct{}) (*adv77bGated, int64) {
	const first, rest = 64 << 10, 256 << 10
	return &adv77bGated{first: bytes.NewReader(bytes.Repeat([]byte("f"), first)), rest: bytes.NewReader(bytes.Repeat([]byte("r"), rest)), gate: gate}, first + rest
}

// TestAdv77bEarlyFinalOwnerLeaves: a sibling's POST relayed through the
// owner gets an early final response (413 Connection: close, or 200) while
// its body is still held back by the client, and the owner leaves right
// then (Close, Shutdown, Close with the pool) before the body goes on. The
// sibling gets what net/http.Transport gets (under Shutdown exactly; under
// Close that or a clear *Error, never other bytes), and every later
// request, the sibling's, gets "ok" as from net/http.
func TestAdv77bEarlyFinalOwnerLeaves(t *testing.T) {
	for _, withTLS := range []bool{false, true} {
		for _, how := range adv77bHow {
			for _, path := range []string{"/early413", "/early200"} {
				name := "plain"
				if withTLS {
					name = "tls"
				}
				t.Run(name+"/"+how+path, func(t *testing.T) {
					u := newAdv10Upstream(t, withTLS, adv77bScript(nil, func() {}))
					ref := adv77bRef(t, u)
					owner, client := remotePair(t, u.conf(func(tr *Transport) { tr.RelayUnreplayable = true }))
					warm(t, owner, u.url("/"))

					refGate := make(chan struct{})
					close(refGate)
					body, n := newAdv77bGated(refGate)
					want := adv77bDo(ref, "POST", u.url(path), body, n, nil, 8*time.Second)

					gate := make(chan struct{})
					var once sync.Once
					open := func() { once.Do(func() { close(gate) }) }
					defer open()
					body, n = newAdv77bGated(gate)
					done := make(chan adv77bResult, 1)
					go func() { done <- adv77bDo(client.tr, "POST", u.url(path), body, n, nil, 10*time.Second) }()
					waitFor(t, 5*time.Second, "the sibling's POST on the owner", func() bool { return owner.node.Stats().ServedRemote > 0 })
					time.Sleep(100 * time.Millisecond)
					left := make(chan struct{})
					go func() { adv77bLeave(owner, how); close(left) }()
					time.Sleep(50 * time.Millisecond)
					open()
					var got adv77bResult
					select {
					case got = <-done:
					case <-time.After(15 * time.Second):
						t.Fatal("the sibling's POST hung as the owner left")
					}
					select {
					case <-left:
					case <-time.After(10 * time.Second):
						t.Fatal("the owner's leave hung")
					}
					if got.err != nil && how != "shutdown" && adv77bClearErr(got.err) && !strings.Contains(got.body, adv77bEvil) {
						// A Close cancels the exchange: a clear failure.
					} else {
						adv77bSame(t, "the sibling's POST "+path, got, want)
					}
					fails := 0
					for range 3 {
						want := adv77bDo(ref, "GET", u.url("/"), nil, 0, nil, 5*time.Second)
						got := adv77bDo(client.tr, "GET", u.url("/"), nil, 0, nil, 5*time.Second)
						if got.err != nil {
							fails++
						}
						adv77bSame(t, "GET / after the owner left", got, want)
					}
					if fails != 0 {
						t.Errorf("%d of 3 requests failed after the owner left; net/http served all", fails)
					}
				})
			}
		}
	}
}

// TestAdv77bBogus101OwnerLeaves: a sibling's GET relayed through the owner
// gets a 101 it did not ask for (no Upgrade), or a refused upgrade (200 to
// a request with Upgrade: websocket), each followed by a stray response on
// the connection. The sibling's answer is net/http's; then the owner
// serves one request of its own and leaves. No later request, the owner's
// before it leaves or the sibling's after, reads the stray bytes, and none
// fails.
func TestAdv77bBogus101OwnerLeaves(t *testing.T) {
	up := http.Header{"Upgrade": {"websocket"}, "Connection": {"Upgrade"}}
	cases := []struct {
		name, path string
		hdr        http.Header
	}{{"bogus101", "/bogus101", nil}, {"refused", "/refuse", up}, {"101noupgrade", "/bogus101", up}}
	for _, withTLS := range []bool{false, true} {
		for _, how := range adv77bHow {
			for _, c := range cases {
				name := "plain"
				if withTLS {
					name = "tls"
				}
				t.Run(name+"/"+how+"/"+c.name, func(t *testing.T) {
					u := newAdv10Upstream(t, withTLS, adv77bScript(nil, func() {}))
					ref := adv77bRef(t, u)
					owner, client := remotePair(t, u.conf(nil))
					warm(t, owner, u.url("/"))
					want := adv77bDo(ref, "GET", u.url(c.path), nil, 0, c.hdr, 5*time.Second)
					got := adv77bDo(client.tr, "GET", u.url(c.path), nil, 0, c.hdr, 5*time.Second)
					if want.err == nil && want.status == http.StatusSwitchingProtocols && c.hdr != nil {
						// net/http hands a 101 with no Upgrade to an upgrade
						// request as an error or a tunnel; compare status only.
						if got.err == nil && got.status != want.status {
							t.Errorf("the sibling's GET %s: %v, net/http %v", c.path, got, want)
						}
					} else if want.err != nil {
						if got.err == nil || !adv77bClearErr(got.err) {
							t.Errorf("the sibling's GET %s: %v, net/http failed (%v): want a clear error", c.path, got, want.err)
						}
					} else {
						adv77bSame(t, "the sibling's GET "+c.path, got, want)
					}
					if strings.Contains(got.body, adv77bEvil) {
						t.Errorf("the sibling's GET %s read the stray bytes: %v", c.path, got)
					}
					if owner.node.Stats().ServedRemote == 0 {
						t.Fatal("the sibling's request did not go through the owner")
					}
					time.Sleep(10 * time.Millisecond)
					if r := adv77bDo(owner.tr, "GET", u.url("/"), nil, 0, nil, 5*time.Second); r.err != nil || r.body != "ok" {
						t.Errorf("the owner's request after %s: %v, want 200 \"ok\"", c.path, r)
					}
					adv77bLeave(owner, how)
					fails := 0
					for range 3 {
						want := adv77bDo(ref, "GET", u.url("/"), nil, 0, nil, 5*time.Second)
						got := adv77bDo(client.tr, "GET", u.url("/"), nil, 0, nil, 5*time.Second)
						if got.err != nil {
							fails++
						}
						adv77bSame(t, "GET / after the owner left", got, want)
					}
					if fails != 0 {
						t.Errorf("%d of 3 requests failed after the owner left; net/http served all", fails)
					}
				})
			}
		}
	}
}
