package proxy

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestAdv77bEarlyKeepSmuggleOwnerLeaves: the upstream answers a POST at once
// (200 "early", keep-alive, or a 101 the POST did not ask for) without
// reading its body, and keeps reading the
// connection: the body, held back by the client, is a request of its own,
// which the upstream answers with stray bytes when it comes. The POST goes
// from a sibling through the owner. While its body is held, a third
// member's GET comes, then the owner leaves and the body goes on. The
// POST's answer is net/http's; no request (the third's during, the
// client's and the third's after) gets the smuggled request's answer, and
// none fails: the owner's connection never served another exchange while a
// request body on it was unfinished.
func TestAdv77bEarlyKeepSmuggleOwnerLeaves(t *testing.T) {
	smuggled := "GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n"
	answers := map[string]string{
		"200":      "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nearly",
		"bogus101": "HTTP/1.1 101 Switching Protocols\r\n\r\n",
	}
	for _, withTLS := range []bool{false, true} {
		for _, how := range adv77bHow {
			for _, early := range []string{"200", "bogus101"} {
				name := "plain"
				if withTLS {
					name = "tls"
				}
				t.Run(name+"/"+how+"/"+early, func(t *testing.T) {
					u := newAdv10Upstream(t, withTLS, func(c net.Conn, br *bufio.Reader, req *http.Request, conn, n int) bool {
						switch {
						case req.URL.Path == "/early":
							io.WriteString(c, answers[early])
							return true // the body is left to be read as a request
						case strings.HasSuffix(req.URL.Path, "smuggled"):
							io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\n"+adv77bEvil)
							return true
						}
						io.Copy(io.Discard, req.Body)
						io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
						return true
					})
					ref := adv77bRef(t, u)
					ms := newFleet(t, 3, u.conf(func(tr *Transport) { tr.MaxConnsPerKey = 1; tr.RelayUnreplayable = true }))
					owner, client, third := ms[0], ms[1], ms[2]
					warm(t, owner, u.url("/"))

					post := func(rt http.RoundTripper, gate <-chan struct{}) adv77bResult {
						body := &adv77bGated{first: bytes.NewReader([]byte("x")), rest: bytes.NewReader([]byte(smuggled)), gate: gate}
						return adv77bDo(rt, "POST", u.url("/early"), body, int64(1+len(smuggled)), nil, 8*time.Second)
					}
					refGate := make(chan struct{})
					var refOnce sync.Once
					defer refOnce.Do(func() { close(refGate) })
					want := post(ref, refGate)
					refOnce.Do(func() { close(refGate) })

					gate := make(chan struct{})
					var once sync.Once
					open := func() { once.Do(func() { close(gate) }) }
					defer open()
					got := post(client.tr, gate)
					if owner.node.Stats().ServedRemote == 0 {
						t.Fatal("the sibling's POST did not go through the owner")
					}
					adv77bSame(t, "the sibling's early-answered POST", got, want)

					fails := 0
					check := func(when string, m *member) {
						r := adv77bDo(m.tr, "GET", u.url("/"), nil, 0, nil, 5*time.Second)
						if strings.Contains(r.body, adv77bEvil) {
							t.Errorf("a GET %s read the smuggled request's answer: %v", when, r)
						}
						if r.err != nil {
							fails++
							t.Logf("GET %s: %v", when, r.err)
							return
						}
						if r.status != 200 || r.body != "ok" {
							t.Errorf("GET %s: %v, want 200 \"ok\"", when, r)
						}
					}
					check("while the POST's body is held", third)
					left := make(chan struct{})
					go func() { adv77bLeave(owner, how); close(left) }()
					time.Sleep(50 * time.Millisecond)
					open()
					select {
					case <-left:
					case <-time.After(10 * time.Second):
						t.Fatal("the owner's leave hung")
					}
					time.Sleep(20 * time.Millisecond)
					for range 2 {
						check("after the owner left", client)
						check("after the owner left", third)
					}
					if fails != 0 {
						t.Errorf("%d of 5 GETs failed; net/http served all", fails)
					}
				})
			}
		}
	}
}
