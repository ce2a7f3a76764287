package proxy

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// adv73aAnswer is a hostile HTTP/1.1 upstream's answer, chosen by path:
// each final response's body is "id=<X-Id>" (padded for /big), and some
// paths send bytes after it that, read as the next response, would answer a
// later request with "SMUGGLED" or an id not its own.
func adv73aAnswer(seen *sync.Map) adv10Answer {
	return func(c net.Conn, br *bufio.Reader, req *http.Request, conn, n int) bool {
		id := req.Header.Get("X-Id")
		v, _ := seen.LoadOrStore(id, new(atomic.Int32))
		v.(*atomic.Int32).Add(1)
		io.Copy(io.Discard, req.Body)
		body := "id=" + id
		smuggled := "HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\nSMUGGLED"
		switch {
		case strings.HasPrefix(req.URL.Path, "/stray"):
			// A second, unsolicited response in the same write.
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s%s", len(body), body, smuggled)
		case strings.HasPrefix(req.URL.Path, "/long"):
			// More body than Content-Length, then a response.
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%sXXXXXXXX%s", len(body), body, smuggled)
		case strings.HasPrefix(req.URL.Path, "/big"):
			// A body of full-size TLS records, the stray bytes in the
			// last one.
			b := body + strings.Repeat(".", 40000)
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s%s", len(b), b, smuggled)
		case strings.HasPrefix(req.URL.Path, "/hints"):
			fmt.Fprintf(c, "HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		case strings.HasPrefix(req.URL.Path, "/bogus101"):
			// 101 to a request that asked for no upgrade, then what
			// would read as the next response.
			fmt.Fprintf(c, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: evil\r\nConnection: Upgrade\r\n\r\n%s", smuggled)
		case strings.HasPrefix(req.URL.Path, "/chunk"):
			// A chunked body with a trailer, then a response.
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-T\r\n\r\n%x\r\n%s\r\n0\r\nX-T: v\r\n\r\n%s", len(body), body, smuggled)
		case strings.HasPrefix(req.URL.Path, "/head204"):
			fmt.Fprintf(c, "HTTP/1.1 204 No Content\r\n\r\n%s", smuggled)
		default:
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		}
		return true
	}
}

var adv73aPaths = []string{"/ok", "/stray", "/ok", "/long", "/ok", "/big", "/hints", "/ok", "/bogus101", "/ok", "/head204", "/ok", "/chunk", "/ok"}

// adv73aDo sends one request with id and checks what comes back: a final
// 200 must carry its own id, never another's or the smuggled bytes.
func adv73aDo(t *testing.T, rt http.RoundTripper, method, path, base, id string) (status int, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var body io.Reader
	if method == "POST" {
		body = strings.NewReader("payload-" + id)
	}
	req, _ := http.NewRequestWithContext(ctx, method, base+path, body)
	req.Header.Set("X-Id", id)
	resp, err := rt.RoundTrip(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusSwitchingProtocols || resp.StatusCode == http.StatusNoContent {
		return resp.StatusCode, nil
	}
	b, rerr := io.ReadAll(resp.Body)
	if rerr != nil {
		return resp.StatusCode, rerr
	}
	got := string(b)
	if resp.StatusCode != 200 || !strings.HasPrefix(got, "id="+id) || strings.Contains(got, "SMUGGLED") || len(got) > len("id="+id) && got[len("id="+id)] != '.' {
		t.Errorf("%s %s (id %s): got %d %.60q, not its own response", method, path, id, resp.StatusCode, got)
	}
	return resp.StatusCode, nil
}

// TestAdv73aMixedHostileUpstreamFleet: three processes share a hostile
// HTTP/1.1 upstream (plain and TLS) whose answers include stray bytes after
// a complete response, a body longer than Content-Length, 103/100 before the
// final response, a 101 to a request that asked for no upgrade and bytes
// after a 204. Two processes send GETs and unreplayable POSTs concurrently
// for about 1.5s: they relay through each other and through the third, dial
// connections of their own once relays pay for them (uncapped), and the
// third process dies as if killed halfway. Properties, as with net/http's
// pool: every 200 carries the answer to its own request; no POST reaches the
// upstream twice; a POST that failed retry-safe never reached it.
func TestAdv73aMixedHostileUpstreamFleet(t *testing.T) {
	for _, withTLS := range []bool{false, true} {
		for _, capped := range []int{0, 2} {
			name := fmt.Sprintf("tls=%v/cap=%d", withTLS, capped)
			t.Run(name, func(t *testing.T) {
				var seen sync.Map
				u := newAdv10Upstream(t, withTLS, adv73aAnswer(&seen))
				ms := newFleet(t, 3, u.conf(func(tr *Transport) { tr.MaxConnsPerKey = capped }))
				victim := ms[2]
				// The victim owns idle connections first.
				var wg sync.WaitGroup
				for i := range 2 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						adv73aDo(t, victim.tr, "GET", "/ok", u.base, fmt.Sprintf("warm%d", i))
					}()
				}
				wg.Wait()

				var (
					mu      sync.Mutex
					postErr = map[string]error{}
					posts   = map[string]bool{}
					getErrs []string
					seq     atomic.Int64
				)
				stop := time.Now().Add(1500 * time.Millisecond)
				for w := range 2 {
					for g := range 4 {
						wg.Add(1)
						go func() {
							defer wg.Done()
							for i := 0; time.Now().Before(stop); i++ {
								path := adv73aPaths[(i+g)%len(adv73aPaths)]
								method := "GET"
								if (i+g)%3 == 0 && path != "/bogus101" {
									method = "POST"
								}
								id := fmt.Sprintf("m%dg%dn%d", w, g, seq.Add(1))
								if method == "POST" {
									mu.Lock()
									posts[id] = true
									mu.Unlock()
								}
								_, err := adv73aDo(t, ms[w].tr, method, path, u.base, id)
								if err != nil {
									mu.Lock()
									if method == "POST" {
										postErr[id] = err
									} else {
										getErrs = append(getErrs, fmt.Sprintf("%s %s: %v", path, id, err))
									}
									mu.Unlock()
								}
							}
						}()
					}
				}
				time.Sleep(700 * time.Millisecond)
				victim.dieAsKilled()
				wg.Wait()
				time.Sleep(200 * time.Millisecond)

				seen.Range(func(k, v any) bool {
					id := k.(string)
					mu.Lock()
					isPost := posts[id]
					mu.Unlock()
					if c := v.(*atomic.Int32).Load(); isPost && c > 1 {
						t.Errorf("POST %s (not replayable) reached the upstream %d times", id, c)
					}
					return true
				})
				mu.Lock()
				defer mu.Unlock()
				for id, err := range postErr {
					v, ok := seen.Load(id)
					if IsRetrySafe(err) && ok && v.(*atomic.Int32).Load() > 0 {
						t.Errorf("POST %s failed retry-safe (%v) but reached the upstream %d times", id, err, v.(*atomic.Int32).Load())
					}
				}
				if len(getErrs) > 0 {
					t.Errorf("%d GETs failed (net/http retries a GET whose reused connection failed), first: %v", len(getErrs), getErrs[:min(len(getErrs), 5)])
				}
				t.Logf("%d requests, %d POST errors, stats %+v / %+v", seq.Load(), len(postErr), ms[0].node.Stats(), ms[1].node.Stats())
			})
		}
	}
}
