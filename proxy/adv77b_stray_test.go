package proxy

import (
	"bufio"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestAdv77bStrayThenOwnerLeaves: an upstream sends bytes after a complete
// response (a second response in the same write or 20ms later, garbage,
// the body of a HEAD, a response after a 204, a response after 64 KiB of
// body in full TLS records) on the owner's connection, to a sibling's
// request relayed through the owner. The sibling's answer is net/http's.
// Then the owner serves one request of its own and leaves (Close,
// Shutdown, Close with the pool); every later request of the sibling gets
// "ok", as from net/http.Transport: none reads the stray bytes, and none
// fails (net/http would have served it).
func TestAdv77bStrayThenOwnerLeaves(t *testing.T) {
	cases := []struct{ method, path string }{
		{"GET", "/stray"}, {"GET", "/straylate"}, {"GET", "/garbage"},
		{"HEAD", "/head"}, {"GET", "/204"}, {"GET", "/big"},
	}
	for _, withTLS := range []bool{false, true} {
		for _, how := range adv77bHow {
			for _, c := range cases {
				name := "plain"
				if withTLS {
					name = "tls"
				}
				t.Run(name+"/"+how+c.path, func(t *testing.T) {
					later := newAdv10Later()
					u := newAdv10Upstream(t, withTLS, adv77bScript(nil, later.sent))
					ref := adv77bRef(t, u)
					owner, client := remotePair(t, u.conf(nil))
					warm(t, owner, u.url("/"))

					want := adv77bDo(ref, c.method, u.url(c.path), nil, 0, nil, 5*time.Second)
					got := adv77bDo(client.tr, c.method, u.url(c.path), nil, 0, nil, 5*time.Second)
					adv77bSame(t, "the sibling's "+c.method+" "+c.path, got, want)
					if owner.node.Stats().ServedRemote == 0 {
						t.Fatal("the sibling's request did not go through the owner")
					}
					if c.path == "/big" && !withTLS {
						// Counted as the owner's exchange ends, which may
						// be after the sibling has read the body.
						waitFor(t, 2*time.Second, "the 64 KiB body to be counted as spliced", func() bool { return owner.node.Stats().SplicedBodies > 0 })
					}
					if c.path == "/straylate" {
						later.wait(t) // the reference's
						later.wait(t) // the owner's
					}
					// The owner's own next request on its connection.
					if r := adv77bDo(owner.tr, "GET", u.url("/"), nil, 0, nil, 5*time.Second); r.err != nil || r.body != "ok" {
						t.Errorf("the owner's request after %s: %v, want 200 \"ok\"", c.path, r)
					}
					adv77bLeave(owner, how)
					fails := 0
					for i := range 4 {
						want := adv77bDo(ref, "GET", u.url("/"), nil, 0, nil, 5*time.Second)
						got := adv77bDo(client.tr, "GET", u.url("/"), nil, 0, nil, 5*time.Second)
						if got.err != nil {
							fails++
						}
						if strings.Contains(got.body, adv77bEvil) {
							t.Errorf("request %d after the owner left read the stray bytes as its response: %v", i, got)
						}
						adv77bSame(t, "the sibling's GET / after the owner left", got, want)
					}
					if fails != 0 {
						t.Errorf("%d of 4 requests failed after the owner left; net/http served all", fails)
					}
				})
			}
		}
	}
}

// TestAdv77bStrayInFlightOwnerLeaves: the owner begins to leave while a
// sibling's exchange is reading a response after which the upstream sends a
// stray response (the held chunked body ends and stray bytes follow at
// once). Under Shutdown the sibling reads the whole body; under Close it
// reads the whole body or fails clearly. No later request, the sibling's
// or a third member's, reads the stray bytes, and none fails.
func TestAdv77bStrayInFlightOwnerLeaves(t *testing.T) {
	for _, withTLS := range []bool{false, true} {
		for _, how := range adv77bHow {
			name := "plain"
			if withTLS {
				name = "tls"
			}
			t.Run(name+"/"+how, func(t *testing.T) {
				release := make(chan struct{})
				evil := "HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\n" + adv77bEvil
				u := newAdv10Upstream(t, withTLS, func(c net.Conn, br *bufio.Reader, req *http.Request, conn, n int) bool {
					if req.URL.Path == "/heldstray" {
						c.Write([]byte("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n"))
						select {
						case <-release:
						case <-time.After(10 * time.Second):
						}
						c.Write([]byte("4\r\nlast\r\n0\r\n\r\n" + evil))
						return true
					}
					return adv77bScript(nil, func() {})(c, br, req, conn, n)
				})
				var released bool
				rel := func() {
					if !released {
						released = true
						close(release)
					}
				}
				defer rel()
				ref := adv77bRef(t, u)
				ms := newFleet(t, 3, u.conf(func(tr *Transport) { tr.MaxConnsPerKey = 1 }))
				owner, client, third := ms[0], ms[1], ms[2]
				warm(t, owner, u.url("/"))

				done := make(chan adv77bResult, 1)
				go func() {
					done <- adv77bDo(client.tr, "GET", u.url("/heldstray"), nil, 0, nil, 15*time.Second)
				}()
				waitFor(t, 5*time.Second, "the sibling's exchange on the owner", func() bool { return owner.node.Stats().ServedRemote > 0 })
				time.Sleep(50 * time.Millisecond)
				left := make(chan struct{})
				go func() { adv77bLeave(owner, how); close(left) }()
				time.Sleep(100 * time.Millisecond)
				rel()
				var r adv77bResult
				select {
				case r = <-done:
				case <-time.After(15 * time.Second):
					t.Fatal("the sibling's exchange hung as the owner left")
				}
				select {
				case <-left:
				case <-time.After(10 * time.Second):
					t.Fatal("the owner's leave hung")
				}
				switch {
				case r.err == nil && r.body == "firstlast":
				case r.err != nil && how != "shutdown" && adv77bClearErr(r.err) && !strings.Contains(r.body, adv77bEvil):
				default:
					t.Errorf("the exchange under way as the owner left (%s): %v, want 200 \"firstlast\"", how, r)
				}
				fails := 0
				for i := range 3 {
					for _, m := range []*member{client, third} {
						want := adv77bDo(ref, "GET", u.url("/"), nil, 0, nil, 5*time.Second)
						got := adv77bDo(m.tr, "GET", u.url("/"), nil, 0, nil, 5*time.Second)
						if got.err != nil {
							fails++
						}
						if strings.Contains(got.body, adv77bEvil) {
							t.Errorf("request %d after the owner left read the stray bytes: %v", i, got)
						}
						adv77bSame(t, "GET / after the owner left", got, want)
					}
				}
				if fails != 0 {
					t.Errorf("%d of 6 requests failed after the owner left; net/http served all", fails)
				}
			})
		}
	}
}
