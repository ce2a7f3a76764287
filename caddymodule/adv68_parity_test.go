package caddymodule

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// reverse_proxy with orbit_pool against the same
// handler with the stock `http` transport, on scenarios around the
// transport: upgrades, leftover bytes, client aborts, retries of requests
// the upstream may have seen.

// adv68Get sends one request on a fresh client connection and returns
// "status body" or the error.
func adv68Do(method, url, body string) string {
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, _ := http.NewRequest(method, url, rd)
	resp, err := c.Do(req)
	if err != nil {
		return "error: " + err.Error()
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Sprintf("%d %q read error", resp.StatusCode, b)
	}
	return fmt.Sprintf("%d %s", resp.StatusCode, b)
}

// comparedSite is a Caddy site a test compares: the stock transport's or
// orbit_pool's, and its port.
type comparedSite struct {
	name string
	port int
}

// bothSites is the stock site and the orbit_pool site, in that order.
func bothSites(stock, orbit int) []comparedSite {
	return []comparedSite{{"stock", stock}, {"orbit", orbit}}
}

// adv68TLSUpstream is adv8RawUpstream over TLS (a self-signed certificate).
func adv68TLSUpstream(t *testing.T, serve func(c net.Conn, br *bufio.Reader)) string {
	t.Helper()
	cert := httptest.NewUnstartedServer(nil)
	cert.StartTLS()
	cfg := cert.TLS.Clone()
	cert.Close()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	return serveRaw(t, ln, serve)
}

// TestAdv68UnsolicitedBytes: an upstream answers a GET with a response
// followed, in the same write, by bytes of a second response nobody asked
// for, then answers later requests on that connection properly. The
// next request through the proxy must get the proper answer (net/http
// closes a connection with unsolicited bytes), for plain and TLS
// upstreams and with the bytes in the same write or just after it.
func TestAdv68UnsolicitedBytes(t *testing.T) {
	for _, tlsOn := range []bool{false, true} {
		for _, later := range []bool{false, true} {
			t.Run(fmt.Sprintf("tls=%v/later=%v", tlsOn, later), func(t *testing.T) {
				serve := func(c net.Conn, br *bufio.Reader) {
					for n := 0; ; n++ {
						req, err := readHead(br)
						if err != nil {
							return
						}
						if req.URL.Path == "/first" {
							first := "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"
							extra := "HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nbogus!"
							if later {
								io.WriteString(c, first)
								time.Sleep(20 * time.Millisecond)
								io.WriteString(c, extra)
							} else {
								io.WriteString(c, first+extra)
							}
							continue
						}
						io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nreal")
					}
				}
				var addr, opts, extra string
				if tlsOn {
					addr = adv68TLSUpstream(t, serve)
					opts = "tls_insecure_skip_verify"
					extra = ""
				} else {
					addr = adv8RawUpstream(t, serve)
				}
				stockPort, orbitPort := freePort(t), freePort(t)
				sites := fmt.Sprintf(`:%d {
	bind 127.0.0.1
	reverse_proxy %s {
		transport http {
			%s
		}
		%s
	}
}
:%d {
	bind 127.0.0.1
	reverse_proxy %s {
		transport orbit_pool {
			%s
		}
		%s
	}
}
`, stockPort, addr, opts, extra, orbitPort, addr, opts, extra)
				startCaddy(t, "", sites)
				for _, v := range bothSites(stockPort, orbitPort) {
					base := fmt.Sprintf("http://127.0.0.1:%d", v.port)
					var got []string
					for i := 0; i < 3; i++ {
						got = append(got, adv68Do("GET", base+"/first", ""))
						time.Sleep(60 * time.Millisecond)
						got = append(got, adv68Do("GET", base+"/second", ""))
					}
					want := strings.Repeat("200 hello|200 real|", 3)
					if g := strings.Join(got, "|") + "|"; g != want {
						t.Errorf("%s: got %s\nwant %s", v.name, g, want)
					}
				}
			})
		}
	}
}

// TestAdv68UpgradeFirstBytes: an upstream that writes its first tunnel
// bytes in the same write as its 101: the client must get them, then an
// echo both ways, through either transport.
func TestAdv68UpgradeFirstBytes(t *testing.T) {
	addr := adv8RawUpstream(t, func(c net.Conn, br *bufio.Reader) {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		if req.Header.Get("Upgrade") != "echo" {
			io.WriteString(c, "HTTP/1.1 400 Bad Request\r\nContent-Length: 2\r\n\r\nno")
			return
		}
		io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\nHELLO")
		buf := make([]byte, 1024)
		for {
			n, err := br.Read(buf)
			if n > 0 {
				c.Write(buf[:n])
			}
			if err != nil {
				return
			}
		}
	})
	stock, orbit := adv8Sites(t, addr, "", "")
	for _, v := range bothSites(stock, orbit) {
		t.Run(v.name, func(t *testing.T) {
			c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", v.port))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(5 * time.Second))
			io.WriteString(c, "GET /ws HTTP/1.1\r\nHost: test\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
			br := bufio.NewReader(c)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != 101 {
				t.Fatalf("status %d", resp.StatusCode)
			}
			buf := make([]byte, 5)
			if _, err := io.ReadFull(br, buf); err != nil || string(buf) != "HELLO" {
				t.Fatalf("first tunnel bytes: %q %v", buf, err)
			}
			for _, msg := range []string{"ping", strings.Repeat("x", 100000)} {
				go io.WriteString(c, msg)
				got := make([]byte, len(msg))
				if _, err := io.ReadFull(br, got); err != nil || string(got) != msg {
					t.Fatalf("echo of %d bytes: %v", len(msg), err)
				}
			}
		})
	}
}

// TestAdv68ClientAbortMidBody: a client that goes away in the middle of a
// large response must not leave the rest of that response on a pooled
// connection: the next requests get their own answers, and the upstream
// never reads a request on a connection whose response it had not
// finished writing.
func TestAdv68ClientAbortMidBody(t *testing.T) {
	var desync atomic.Int64
	addr := adv8RawUpstream(t, func(c net.Conn, br *bufio.Reader) {
		unfinished := false
		for {
			req, err := readHead(br)
			if err != nil {
				return
			}
			if unfinished {
				desync.Add(1)
			}
			if req.URL.Path == "/big" {
				const size = 4 << 20
				io.WriteString(c, fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n", size))
				chunk := []byte(strings.Repeat("B", 32<<10))
				sent := 0
				for sent < size {
					n, err := c.Write(chunk)
					sent += n
					if err != nil {
						break
					}
					time.Sleep(time.Millisecond)
				}
				if sent < size {
					unfinished = true
				}
				continue
			}
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nsmall")
		}
	})
	stock, orbit := adv8Sites(t, addr, "", "")
	for _, v := range bothSites(stock, orbit) {
		t.Run(v.name, func(t *testing.T) {
			desync.Store(0)
			base := fmt.Sprintf("http://127.0.0.1:%d", v.port)
			for round := 0; round < 3; round++ {
				c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", v.port))
				if err != nil {
					t.Fatal(err)
				}
				c.SetDeadline(time.Now().Add(5 * time.Second))
				io.WriteString(c, "GET /big HTTP/1.1\r\nHost: test\r\n\r\n")
				buf := make([]byte, 200<<10)
				io.ReadFull(c, buf)
				c.Close()
				time.Sleep(50 * time.Millisecond)
				for i := 0; i < 3; i++ {
					if got := adv68Do("GET", base+"/small", ""); got != "200 small" {
						t.Errorf("round %d, request %d after the abort: %s", round, i, got)
					}
				}
			}
			if n := desync.Load(); n != 0 {
				t.Errorf("the upstream read %d requests on connections with a response not fully written", n)
			}
		})
	}
}

// TestAdv68PostNotReplayed: a POST whose upstream read it whole and closed
// without an answer may have had its effect: reverse_proxy must not send
// it to another upstream (stock answers 502, and the second upstream never
// sees it), on a fresh connection and on a reused one.
func TestAdv68PostNotReplayed(t *testing.T) {
	var bPosts atomic.Int64
	a := adv8RawUpstream(t, func(c net.Conn, br *bufio.Reader) {
		for {
			req, err := readHead(br)
			if err != nil {
				return
			}
			if req.Method == "POST" {
				return // read whole, then closed: no answer
			}
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\na")
		}
	})
	b := adv8RawUpstream(t, func(c net.Conn, br *bufio.Reader) {
		for {
			req, err := readHead(br)
			if err != nil {
				return
			}
			if req.Method == "POST" {
				bPosts.Add(1)
			}
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nb")
		}
	})
	stock, orbit := adv8Sites(t, a+" "+b, "", "lb_policy first\n\t\tlb_retries 2")
	for _, body := range []string{"small", strings.Repeat("z", 64<<10)} {
		for _, warm := range []bool{false, true} {
			for _, v := range bothSites(stock, orbit) {
				t.Run(fmt.Sprintf("%s/body=%d/warm=%v", v.name, len(body), warm), func(t *testing.T) {
					bPosts.Store(0)
					base := fmt.Sprintf("http://127.0.0.1:%d", v.port)
					c := &http.Client{Timeout: 5 * time.Second}
					defer c.CloseIdleConnections()
					if warm {
						resp, err := c.Get(base + "/warm")
						if err != nil {
							t.Fatal(err)
						}
						io.ReadAll(resp.Body)
						resp.Body.Close()
					}
					resp, err := c.Post(base+"/post", "text/plain", strings.NewReader(body))
					if err != nil {
						t.Fatal(err)
					}
					got, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					if resp.StatusCode != 502 || bPosts.Load() != 0 {
						t.Errorf("POST: %d %q, second upstream saw %d POSTs; want 502 and none", resp.StatusCode, got, bPosts.Load())
					}
				})
			}
		}
	}
}

// TestAdv68HandleResponseReplaces: handle_response replacing an upstream's
// error answer leaves the upstream's unread body behind; the next
// requests still get their own answers.
func TestAdv68HandleResponseReplaces(t *testing.T) {
	addr := adv8RawUpstream(t, func(c net.Conn, br *bufio.Reader) {
		for {
			req, err := readHead(br)
			if err != nil {
				return
			}
			if req.URL.Path == "/err" {
				body := strings.Repeat("E", 64<<10)
				io.WriteString(c, fmt.Sprintf("HTTP/1.1 500 Oops\r\nContent-Length: %d\r\n\r\n%s", len(body), body))
				continue
			}
			if req.URL.Path == "/errsmall" {
				io.WriteString(c, "HTTP/1.1 500 Oops\r\nContent-Length: 3\r\n\r\nEEE")
				continue
			}
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}
	})
	stock, orbit := adv8Sites(t, addr, "", "@err status 500\n\t\thandle_response @err {\n\t\t\trespond \"replaced {rp.status_code}\" 503\n\t\t}")
	for _, v := range bothSites(stock, orbit) {
		t.Run(v.name, func(t *testing.T) {
			base := fmt.Sprintf("http://127.0.0.1:%d", v.port)
			c := &http.Client{Timeout: 5 * time.Second}
			defer c.CloseIdleConnections()
			var got []string
			for i := 0; i < 4; i++ {
				for _, p := range []string{"/err", "/ok", "/errsmall", "/ok"} {
					resp, err := c.Get(base + p)
					if err != nil {
						got = append(got, "error")
						continue
					}
					b, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					got = append(got, fmt.Sprintf("%d %s", resp.StatusCode, b))
				}
			}
			want := strings.Repeat("503 replaced 500|200 ok|503 replaced 500|200 ok|", 4)
			if g := strings.Join(got, "|") + "|"; g != want {
				t.Errorf("got  %s\nwant %s", g, want)
			}
		})
	}
}

// TestAdv68NoReuseAfter: after each of these first answers, a client's
// next request must get the upstream's proper answer, as through the
// stock transport: the upstream keeps the connection open and would answer
// "wrong" to any request on it after the first.
func TestAdv68NoReuseAfter(t *testing.T) {
	cases := []struct {
		name, method, first string
	}{
		{"connection-close", "GET", "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 5\r\n\r\nfirst"},
		{"http10", "GET", "HTTP/1.0 200 OK\r\nContent-Length: 5\r\n\r\nfirst"},
		{"http10-until-close", "GET", "HTTP/1.0 200 OK\r\n\r\nfirst"},
		{"no-length", "GET", "HTTP/1.1 200 OK\r\n\r\nfirst"},
		{"head-with-body", "HEAD", "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfirst"},
		{"204-with-body", "GET", "HTTP/1.1 204 No Content\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfirst"},
		{"304-with-body", "GET", "HTTP/1.1 304 Not Modified\r\nContent-Length: 5\r\n\r\nfirst"},
		{"chunked-extra", "GET", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n0\r\n\r\nXX"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var untilClose = strings.Contains(tc.name, "until-close") || tc.name == "no-length"
			addr := adv8RawUpstream(t, func(c net.Conn, br *bufio.Reader) {
				for n := 0; ; n++ {
					req, err := readHead(br)
					if err != nil {
						return
					}
					if req.URL.Path == "/first" {
						io.WriteString(c, tc.first)
						if untilClose {
							// the end of the body is the close: keep it
							// open a little, then close.
							time.Sleep(50 * time.Millisecond)
							return
						}
						continue
					}
					if n > 0 {
						io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nwrong")
						continue
					}
					io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nreal")
				}
			})
			stock, orbit := adv8Sites(t, addr, "", "")
			res := map[string]string{}
			for _, v := range bothSites(stock, orbit) {
				base := fmt.Sprintf("http://127.0.0.1:%d", v.port)
				var got []string
				for i := 0; i < 3; i++ {
					got = append(got, adv68Do(tc.method, base+"/first", ""))
					time.Sleep(80 * time.Millisecond)
					got = append(got, adv68Do("GET", base+"/second", ""))
				}
				res[v.name] = strings.Join(got, "|")
			}
			if res["stock"] != res["orbit"] {
				t.Errorf("stock: %s\norbit: %s", res["stock"], res["orbit"])
			}
			if strings.Contains(res["orbit"], "wrong") {
				t.Errorf("orbit reused a connection it must not: %s", res["orbit"])
			}
		})
	}
}

// TestAdv68CanceledWhileWaiting: a client that gives up while the upstream
// is still working on its request must not leave that late answer to the
// next request.
func TestAdv68CanceledWhileWaiting(t *testing.T) {
	addr := adv8RawUpstream(t, func(c net.Conn, br *bufio.Reader) {
		for {
			req, err := readHead(br)
			if err != nil {
				return
			}
			if req.URL.Path == "/slow" {
				time.Sleep(300 * time.Millisecond)
				io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nslow")
				continue
			}
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nfast")
		}
	})
	stock, orbit := adv8Sites(t, addr, "", "")
	for _, v := range bothSites(stock, orbit) {
		t.Run(v.name, func(t *testing.T) {
			base := fmt.Sprintf("http://127.0.0.1:%d", v.port)
			for round := 0; round < 3; round++ {
				c := &http.Client{Timeout: 50 * time.Millisecond}
				if _, err := c.Get(base + "/slow"); err == nil {
					t.Fatal("slow request did not time out")
				}
				for i := 0; i < 4; i++ {
					if got := adv68Do("GET", base+"/fast", ""); got != "200 fast" {
						t.Errorf("round %d request %d: %s", round, i, got)
					}
					time.Sleep(100 * time.Millisecond)
				}
			}
		})
	}
}

// TestAdv68ClientAbortMidUpload: a client that sends part of a body and
// goes away must not have the proxy's next request read as the rest of
// that body (request smuggling); the next requests get their answers.
func TestAdv68ClientAbortMidUpload(t *testing.T) {
	var smuggled atomic.Int64
	var bodies sync.Map
	addr := adv8RawUpstream(t, func(c net.Conn, br *bufio.Reader) {
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			b, err := io.ReadAll(req.Body)
			if strings.Contains(string(b), "HTTP/1.1") || strings.Contains(string(b), "GET ") {
				smuggled.Add(1)
			}
			if err != nil {
				return
			}
			bodies.Store(req.URL.Path, len(b))
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nfast")
		}
	})
	stock, orbit := adv8Sites(t, addr, "", "")
	for _, chunked := range []bool{false, true} {
		for _, size := range []int{1000, 200 << 10} {
			for _, v := range bothSites(stock, orbit) {
				t.Run(fmt.Sprintf("%s/chunked=%v/size=%d", v.name, chunked, size), func(t *testing.T) {
					smuggled.Store(0)
					base := fmt.Sprintf("http://127.0.0.1:%d", v.port)
					for round := 0; round < 2; round++ {
						c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", v.port))
						if err != nil {
							t.Fatal(err)
						}
						part := strings.Repeat("p", size/2)
						if chunked {
							fmt.Fprintf(c, "POST /up HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n", len(part), part)
						} else {
							fmt.Fprintf(c, "POST /up HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n%s", size, part)
						}
						time.Sleep(100 * time.Millisecond)
						c.Close()
						time.Sleep(50 * time.Millisecond)
						for i := 0; i < 3; i++ {
							if got := adv68Do("GET", base+"/after", ""); got != "200 fast" {
								t.Errorf("round %d request %d: %s", round, i, got)
							}
							if got := adv68Do("POST", base+"/after-post", "0123456789"); got != "200 fast" {
								t.Errorf("round %d post %d: %s", round, i, got)
							}
						}
					}
					if n := smuggled.Load(); n != 0 {
						t.Errorf("%d request bodies held another request's bytes", n)
					}
				})
			}
		}
	}
}

// TestAdv68LargeBodyRetriedWhole: a POST whose first upstream cannot be
// dialed goes to the next one (lb_retries) with its whole body, whatever
// its size and framing, as through the stock transport. (Bodies of 4095
// and 4096 bytes, which Go's client sends in two writes, fail: see
// TestAdv68SmallBodyRetriedAfterDialError.)
func TestAdv68LargeBodyRetriedWhole(t *testing.T) {
	up := newUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		fmt.Fprintf(w, "%d %v", len(b), err)
	}), false)
	dead := freePort(t)
	stock, orbit := adv8Sites(t, fmt.Sprintf("127.0.0.1:%d %s", dead, up.hostport()), "dial_timeout 1s",
		"lb_policy round_robin\n\t\tlb_retries 1")
	// Round robin over the dead and the live upstream: each case is sent
	// twice, so that one of the two tries the dead one first.
	for _, size := range []int{3000, 3000, 4097, 4097, 64 << 10, 64 << 10, 3 << 20, 3 << 20} {
		for _, chunked := range []bool{false, false, true, true} {
			for _, v := range bothSites(stock, orbit) {
				body := strings.Repeat("q", size)
				var rd io.Reader = strings.NewReader(body)
				if chunked {
					rd = io.MultiReader(rd) // no length: chunked
				}
				req, _ := http.NewRequest("POST", fmt.Sprintf("http://127.0.0.1:%d/", v.port), rd)
				resp, err := client.Do(req)
				if err != nil {
					t.Errorf("%s size=%d chunked=%v: %v", v.name, size, chunked, err)
					continue
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if want := fmt.Sprintf("%d <nil>", size); resp.StatusCode != 200 || string(b) != want {
					t.Errorf("%s size=%d chunked=%v: %d %q, want 200 %q", v.name, size, chunked, resp.StatusCode, b, want)
				}
			}
		}
	}
}

// TestAdv68AbortWhileWaitingForCap: clients that give up while waiting
// for a connection under max_conns_per_host leave nothing held: once the
// one running request ends, the next request is served at once.
func TestAdv68AbortWhileWaitingForCap(t *testing.T) {
	up := newUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			time.Sleep(300 * time.Millisecond)
		}
		io.WriteString(w, "ok")
	}), false)
	port := freePort(t)
	startCaddy(t, "max_in_flight 4", site(port, up.hostport(), "max_conns_per_host 1\n\t\t\twait_timeout 3s", ""))
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	for round := 0; round < 3; round++ {
		done := make(chan string, 1)
		go func() { done <- adv68Do("GET", base+"/slow", "") }()
		time.Sleep(50 * time.Millisecond)
		var wg sync.WaitGroup
		for i := 0; i < 8; i++ { // more than max_in_flight
			wg.Add(1)
			go func() {
				defer wg.Done()
				c := &http.Client{Timeout: 60 * time.Millisecond}
				if resp, err := c.Get(base + "/fast"); err == nil {
					resp.Body.Close()
				}
			}()
		}
		wg.Wait()
		if got := <-done; got != "200 ok" {
			t.Fatalf("round %d: the running request: %s", round, got)
		}
		start := time.Now()
		got := adv68Do("GET", base+"/fast", "")
		if took := time.Since(start); got != "200 ok" || took > time.Second {
			t.Fatalf("round %d: after the aborted waiters: %s in %s", round, got, took)
		}
	}
	waitFor(t, 3*time.Second, "one upstream connection at most", func() bool { return up.open.Load() <= 1 })
}

// TestAdv68HeaderOps: header_up (Host included) and header_down reach the
// upstream and the client alike through both transports.
func TestAdv68HeaderOps(t *testing.T) {
	var seen adv8Seen
	up := newUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen.add(r.Header.Get("X-Case"), fmt.Sprintf("host=%s x-up=%q x-gone=%q xff=%v", r.Host, r.Header.Get("X-Up"), r.Header.Get("X-Gone"), r.Header["X-Forwarded-Host"]))
		w.Header().Set("X-Secret", "s")
		w.Header().Set("X-Keep", "k")
		io.WriteString(w, "ok")
	}), false)
	stock, orbit := adv8Sites(t, up.hostport(), "",
		"header_up Host backend.example\n\t\theader_up X-Up \"{http.request.method}-1\"\n\t\theader_up -X-Gone\n\t\theader_down -X-Secret\n\t\theader_down X-Added yes")
	res := map[string]string{}
	for _, v := range bothSites(stock, orbit) {
		got := adv8Exchange(t, v.port, "GET /h HTTP/1.1\r\nHost: front.example\r\nX-Case: h\r\nX-Gone: 1\r\nConnection: close\r\n\r\n", false)
		res[v.name] = got + fmt.Sprint(seen.take("h"))
	}
	if res["stock"] != res["orbit"] {
		t.Errorf("stock: %s\norbit: %s", res["stock"], res["orbit"])
	}
	if !strings.Contains(res["orbit"], "host=backend.example") || strings.Contains(res["orbit"], "X-Secret") {
		t.Errorf("orbit: %s", res["orbit"])
	}
}

// TestAdv68UpgradeRefusedOrUnasked: an upstream that refuses an upgrade
// (200, keep-alive) or switches protocols unasked (101 to a plain GET):
// the client gets what the stock transport gives it, and later requests
// get their own answers.
func TestAdv68UpgradeRefusedOrUnasked(t *testing.T) {
	addr := adv8RawUpstream(t, func(c net.Conn, br *bufio.Reader) {
		for {
			req, err := readHead(br)
			if err != nil {
				return
			}
			switch req.URL.Path {
			case "/refuse":
				io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 7\r\n\r\nrefused")
			case "/unasked":
				io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\nRAW-TUNNEL-BYTES")
				io.Copy(io.Discard, br)
				return
			default:
				io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nreal")
			}
		}
	})
	stock, orbit := adv8Sites(t, addr, "", "")
	res := map[string]string{}
	for _, v := range bothSites(stock, orbit) {
		var got []string
		for i := 0; i < 2; i++ {
			got = append(got, adv8Exchange(t, v.port, "GET /refuse HTTP/1.1\r\nHost: t\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n", false))
			got = append(got, adv68Do("GET", fmt.Sprintf("http://127.0.0.1:%d/next", v.port), ""))
			got = append(got, adv68Do("GET", fmt.Sprintf("http://127.0.0.1:%d/unasked", v.port), ""))
			got = append(got, adv68Do("GET", fmt.Sprintf("http://127.0.0.1:%d/next", v.port), ""))
		}
		res[v.name] = strings.Join(got, "|")
	}
	if res["stock"] != res["orbit"] {
		t.Errorf("stock: %s\norbit: %s", res["stock"], res["orbit"])
	}
}

// TestAdv68HeaderTimeoutRetried: a GET whose first upstream does not
// answer within response_header_timeout is retried on the next upstream
// (lb_retries), through either transport; a POST is not, and gets 504.
func TestAdv68HeaderTimeoutRetried(t *testing.T) {
	hang := adv8RawUpstream(t, func(c net.Conn, br *bufio.Reader) {
		readHead(br)
		time.Sleep(1500 * time.Millisecond)
	})
	good := newUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.ReadAll(r.Body)
		io.WriteString(w, "good")
	}), false)
	stock, orbit := freePort(t), freePort(t)
	lb := "lb_policy round_robin\n\t\tlb_retries 1"
	startCaddy(t, "", fmt.Sprintf(`:%d {
	bind 127.0.0.1
	reverse_proxy %s %s {
		transport http {
			response_header_timeout 200ms
		}
		%s
	}
}
:%d {
	bind 127.0.0.1
	reverse_proxy %s %s {
		transport orbit_pool {
			response_header_timeout 200ms
		}
		%s
	}
}
`, stock, hang, good.hostport(), lb, orbit, hang, good.hostport(), lb))
	res := map[string]string{}
	for _, v := range bothSites(stock, orbit) {
		var got []string
		for i := 0; i < 2; i++ {
			got = append(got, adv68Do("GET", fmt.Sprintf("http://127.0.0.1:%d/", v.port), ""))
		}
		for i := 0; i < 2; i++ {
			got = append(got, adv68Do("POST", fmt.Sprintf("http://127.0.0.1:%d/", v.port), "x"))
		}
		res[v.name] = strings.Join(got, "|")
	}
	if res["stock"] != res["orbit"] {
		t.Errorf("stock: %s\norbit: %s", res["stock"], res["orbit"])
	}
	// Every other request starts on the hanging upstream (round robin
	// over two, each attempt taking a turn): the GETs go on to the good
	// one, the POSTs do not.
	if !strings.HasPrefix(res["orbit"], "200 good|200 good|") || !strings.Contains(res["orbit"], "504") {
		t.Errorf("orbit: %s", res["orbit"])
	}
}

// TestAdv68UpgradeUpstreamCloses: the upstream ends a tunnel (its last
// bytes, then close): the client gets those bytes and then the end of its
// connection promptly, through either transport.
func TestAdv68UpgradeUpstreamCloses(t *testing.T) {
	addr := adv8RawUpstream(t, func(c net.Conn, br *bufio.Reader) {
		if _, err := readHead(br); err != nil {
			return
		}
		io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
		line, _ := br.ReadString('\n')
		io.WriteString(c, "bye "+line)
	})
	stock, orbit := adv8Sites(t, addr, "", "")
	for _, v := range bothSites(stock, orbit) {
		t.Run(v.name, func(t *testing.T) {
			c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", v.port))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(3 * time.Second))
			io.WriteString(c, "GET /ws HTTP/1.1\r\nHost: t\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
			br := bufio.NewReader(c)
			resp, err := http.ReadResponse(br, nil)
			if err != nil || resp.StatusCode != 101 {
				t.Fatalf("upgrade: %v %v", resp, err)
			}
			io.WriteString(c, "hi\n")
			start := time.Now()
			rest, err := io.ReadAll(br)
			if string(rest) != "bye hi\n" || err != nil || time.Since(start) > time.Second {
				t.Errorf("after the upstream's close: %q %v after %s", rest, err, time.Since(start))
			}
		})
	}
}

// TestAdv68RetryOnStatus: reverse_proxy's response-based retry
// (lb_retry_match on {rp.status_code}) of a GET whose first upstream
// answers 503 ends on the next upstream, through either transport.
func TestAdv68RetryOnStatus(t *testing.T) {
	bad := newUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(503)
		io.WriteString(w, strings.Repeat("x", 10000))
	}), false)
	good := newUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "good")
	}), false)
	stock, orbit := adv8Sites(t, bad.hostport()+" "+good.hostport(), "",
		"lb_policy round_robin\n\t\tlb_retries 1\n\t\tlb_retry_match {\n\t\t\texpression `{rp.status_code} == 503`\n\t\t}")
	for _, v := range bothSites(stock, orbit) {
		for i := 0; i < 4; i++ {
			if got := adv68Do("GET", fmt.Sprintf("http://127.0.0.1:%d/", v.port), ""); got != "200 good" {
				t.Errorf("%s request %d: %s", v.name, i, got)
			}
		}
	}
	if bad.requests.Load() == 0 {
		t.Error("the 503 upstream was never tried: nothing was retried")
	}
}

// TestAdv68RetryOnStatusBufferedPost: with request_buffers, a POST whose
// first upstream answers 503 (lb_retry_match) goes to the next upstream
// with its whole body, through either transport (the README's advice for
// such retries).
func TestAdv68RetryOnStatusBufferedPost(t *testing.T) {
	bad := newUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.ReadAll(r.Body)
		w.WriteHeader(503)
	}), false)
	good := newUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		fmt.Fprintf(w, "%d %v", len(b), err)
	}), false)
	stock, orbit := adv8Sites(t, bad.hostport()+" "+good.hostport(), "",
		"request_buffers 64k\n\t\tlb_policy round_robin\n\t\tlb_retries 1\n\t\tlb_retry_match {\n\t\t\texpression `{rp.status_code} == 503`\n\t\t}")
	for _, size := range []int{100, 3000, 4095, 20000} {
		for _, v := range bothSites(stock, orbit) {
			for i := 0; i < 2; i++ {
				got := adv68PostCookie(fmt.Sprintf("http://127.0.0.1:%d/", v.port), strings.Repeat("b", size), 1200)
				if want := fmt.Sprintf("200 %d <nil>", size); got != want {
					t.Errorf("%s body %d request %d: %s, want %s", v.name, size, i, got, want)
				}
			}
		}
	}
	if bad.requests.Load() == 0 {
		t.Error("the 503 upstream was never tried")
	}
}
