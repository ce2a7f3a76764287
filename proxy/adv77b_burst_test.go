package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestAdv77bStrayBurstOwnerLeaves: two answers in three of the upstream are
// followed, in the same write, by a stray response (a second response, or
// a 204 with a response after it). A fleet of three shares
// one connection (cap 1, the owner's); two siblings send 8 requests each at
// once, most of them paused for room and woken to run on the owner's
// connection through the hop as it comes free, and the owner leaves 50ms
// into the burst. Every request gets its own "ok <path>" as from
// net/http.Transport, within its 8s deadline; none reads a stray byte and
// none fails.
func TestAdv77bStrayBurstOwnerLeaves(t *testing.T) {
	evil := "HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\n" + adv77bEvil
	for _, withTLS := range []bool{false, true} {
		for _, how := range adv77bHow {
			name := "plain"
			if withTLS {
				name = "tls"
			}
			t.Run(name+"/"+how, func(t *testing.T) {
				u := newAdv10Upstream(t, withTLS, func(c net.Conn, br *bufio.Reader, req *http.Request, conn, n int) bool {
					io.Copy(io.Discard, req.Body)
					time.Sleep(5 * time.Millisecond) // hold the connection a moment
					body := "ok " + req.URL.Path
					head := fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
					switch {
					case req.URL.Path == "/warm" || n%3 == 0:
						io.WriteString(c, head)
					case n%3 == 1:
						io.WriteString(c, head+evil)
					default:
						io.WriteString(c, head+"HTTP/1.1 204 No Content\r\n\r\n"+evil)
					}
					return true
				})
				ref := adv77bRef(t, u)
				ms := newFleet(t, 3, u.conf(func(tr *Transport) { tr.MaxConnsPerKey = 1 }))
				owner, client, third := ms[0], ms[1], ms[2]
				warm(t, owner, u.url("/warm"))

				type res struct {
					path string
					r    adv77bResult
				}
				const each = 8
				results := make(chan res, 2*each)
				var wg sync.WaitGroup
				for mi, m := range []*member{client, third} {
					for i := range each {
						wg.Add(1)
						go func() {
							defer wg.Done()
							p := fmt.Sprintf("/m%d-%d", mi, i)
							results <- res{p, adv77bDo(m.tr, "GET", u.url(p), nil, 0, nil, 8*time.Second)}
						}()
					}
				}
				time.Sleep(50 * time.Millisecond)
				left := make(chan struct{})
				go func() { adv77bLeave(owner, how); close(left) }()
				waited := make(chan struct{})
				go func() { wg.Wait(); close(waited) }()
				select {
				case <-waited:
				case <-time.After(12 * time.Second):
					t.Fatal("requests hung past their deadline as the owner left")
				}
				close(results)
				fails := 0
				for r := range results {
					if strings.Contains(r.r.body, adv77bEvil) || (r.r.err == nil && r.r.body != "ok "+r.path) {
						t.Errorf("%s got another response's bytes: %v", r.path, r.r)
					}
					if r.r.err != nil {
						fails++
						t.Logf("%s: %v", r.path, r.r.err)
						continue
					}
					want := adv77bDo(ref, "GET", u.url(r.path), nil, 0, nil, 5*time.Second)
					adv77bSame(t, r.path, r.r, want)
				}
				if fails != 0 {
					t.Errorf("%d of %d requests failed as the owner left (%s); net/http served all", fails, 2*each, how)
				}
				if owner.node.Stats().ServedRemote == 0 {
					t.Error("no sibling's request ran on the owner's connection")
				}
				select {
				case <-left:
				case <-time.After(10 * time.Second):
					t.Fatal("the owner's leave hung")
				}
				// After the burst, each sibling again.
				for _, m := range []*member{client, third} {
					if r := adv77bDo(m.tr, "GET", u.url("/after"), nil, 0, nil, 5*time.Second); r.err != nil || r.body != "ok /after" {
						t.Errorf("a request after the owner left: %v, want 200 \"ok /after\"", r)
					}
				}
			})
		}
	}
}
