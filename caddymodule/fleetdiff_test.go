package caddymodule

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/textproto"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// The fleet-level differential test sends one matrix of exchanges through a
// fleet of three workers sharing one upstream connection per upstream (so
// that most exchanges go through a sibling's connection), and through stock
// Caddy with its own http transport, against the same scripted upstreams, and
// requires the same answers from both: status, headers that matter, body,
// trailers, 1xx responses, and the client's expect-continue timing.

// scriptedUpstream answers each request as its path says, over plain TCP or
// TLS, keeping the connection alive between exchanges unless the script
// closes it. Scripts include the misbehaviours that break connection reuse.
type scriptedUpstream struct {
	ln net.Listener
	wg sync.WaitGroup
}

func newScriptedUpstream(t *testing.T, tlsOn bool) *scriptedUpstream {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if tlsOn {
		// httptest's certificate, for a server of our own.
		ts := httptest.NewUnstartedServer(nil)
		ts.StartTLS()
		certs := ts.TLS.Certificates
		ts.Close()
		ln = tls.NewListener(ln, &tls.Config{Certificates: certs, NextProtos: []string{"http/1.1"}})
	}
	u := &scriptedUpstream{ln: ln}
	u.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u.wg.Go(func() { u.serve(c) })
		}
	})
	t.Cleanup(func() {
		ln.Close()
		u.wg.Wait()
	})
	return u
}

func (u *scriptedUpstream) addr() string { return u.ln.Addr().String() }

func (u *scriptedUpstream) serve(c net.Conn) {
	defer c.Close()
	br := bufio.NewReader(c)
	for {
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		if !u.answer(c, br, req) {
			return
		}
	}
}

// answer writes the scripted response; false closes the connection.
func (u *scriptedUpstream) answer(c net.Conn, br *bufio.Reader, req *http.Request) bool {
	reply := func(s string) bool {
		_, err := io.WriteString(c, s)
		return err == nil
	}
	drain := func() { io.Copy(io.Discard, req.Body) }
	path := req.URL.Path
	switch path {
	case "/ok":
		drain()
		return reply("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nX-Script: ok\r\nContent-Length: 5\r\n\r\nhello")
	case "/echo":
		body, _ := io.ReadAll(req.Body)
		return reply(fmt.Sprintf("HTTP/1.1 200 OK\r\nX-Method: %s\r\nX-Req-Trailer: %s\r\nContent-Length: %d\r\n\r\n%s",
			req.Method, req.Trailer.Get("X-T"), len(body), body))
	case "/trailers":
		drain()
		// With a type: without one, Caddy's header flush races its first
		// body write, and the winner decides whether the type is sniffed.
		return reply("HTTP/1.1 200 OK\r\nContent-Type: text/x-trailers\r\nTrailer: X-Sum\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nX-Sum: 42\r\n\r\n")
	case "/early-hints":
		drain()
		return reply("HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n" +
			"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
	case "/big":
		drain()
		body := bytes.Repeat([]byte("0123456789abcdef"), 1<<14) // 256 KiB
		return reply(fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(body), body))
	case "/smuggle":
		// A complete response and, in the same write, another nobody asked
		// for: a reused connection must not hand it to the next client.
		drain()
		body := strings.Repeat("s", 8<<10)
		return reply(fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(body), body) +
			"HTTP/1.1 200 OK\r\nContent-Length: 22\r\n\r\nSMUGGLED-FROM-PREVIOUS")
	case "/close-mid-body":
		drain()
		reply("HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n" + strings.Repeat("x", 100))
		return false
	case "/connection-close":
		drain()
		reply("HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 3\r\n\r\nbye")
		return false
	case "/idle-close":
		// Answers, then closes the connection once it has been idle a
		// little: the next exchange, after a gap, meets a closed connection.
		drain()
		if !reply("HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nidle") {
			return false
		}
		c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		if _, err := br.Peek(1); err != nil {
			return false
		}
		return true
	case "/malformed":
		drain()
		reply("HTTP/1.1 2x0 Nope\r\n\r\n")
		return false
	case "/expect-417":
		// Refuses without reading the body; the unread body ends the
		// connection, closed as net/http's server closes one: the write
		// side first, then the rest a little later, so that the unread
		// body does not reset the connection before the refusal is read.
		reply("HTTP/1.1 417 Expectation Failed\r\nConnection: close\r\nContent-Length: 0\r\n\r\n")
		if cw, ok := c.(interface{ CloseWrite() error }); ok {
			cw.CloseWrite()
		}
		time.Sleep(300 * time.Millisecond)
		return false
	case "/early-101":
		// Switches protocols while the request body is still coming, then
		// echoes whatever arrives.
		if !reply("HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n") {
			return false
		}
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		io.Copy(c, br)
		return false
	}
	drain()
	reply("HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
	return true
}

// exchange is one request of the matrix.
type exchange struct {
	name    string
	method  string
	path    string
	body    string
	chunked bool // body of unknown length, with a trailer
	expect  bool
	gap     time.Duration // idle time before it
}

var exchangeMatrix = []exchange{
	{name: "ok", path: "/ok"},
	{name: "echo-post", method: "POST", path: "/echo", body: strings.Repeat("p", 256<<10)},
	{name: "echo-chunked-trailer", method: "POST", path: "/echo", body: "streamed", chunked: true},
	// More than request_body's max_size: the body's error is the client's
	// (413), not the upstream's.
	{name: "over-max-size", method: "POST", path: "/limited/echo", body: strings.Repeat("m", 100<<10), chunked: true},
	{name: "trailers", path: "/trailers"},
	{name: "early-hints", path: "/early-hints"},
	{name: "big", path: "/big"},
	{name: "smuggle", path: "/smuggle"},
	{name: "after-smuggle", path: "/ok", gap: 300 * time.Millisecond},
	{name: "close-mid-body", path: "/close-mid-body"},
	{name: "after-close-mid-body", path: "/ok"},
	{name: "connection-close", path: "/connection-close"},
	{name: "after-connection-close", path: "/echo", method: "POST", body: "after close"},
	{name: "idle-close", path: "/idle-close"},
	{name: "after-idle-close", path: "/ok", gap: 300 * time.Millisecond},
	{name: "after-idle-close-post", path: "/echo", method: "POST", body: strings.Repeat("q", 256<<10)},
	{name: "malformed", path: "/malformed"},
	{name: "after-malformed", path: "/ok"},
	{name: "expect-417", method: "PUT", path: "/expect-417", body: strings.Repeat("e", 16<<10), expect: true},
	{name: "after-expect", path: "/ok"},
	{name: "early-101", path: "/early-101"},
	{name: "after-early-101", path: "/ok"},
	{name: "after-gap", path: "/ok", gap: time.Second},
}

// answer is what a client saw of one exchange.
type answer struct {
	status   int
	header   string // the headers that must agree
	body     string // a digest of the body
	bodyErr  bool
	trailer  string
	informed string // 1xx statuses seen
	elapsed  time.Duration
}

func (a answer) String() string {
	return fmt.Sprintf("status %d, headers %q, body %s (error %v), trailer %q, 1xx %q", a.status, a.header, a.body, a.bodyErr, a.trailer, a.informed)
}

// same compares what both must agree on; time is judged separately.
func (a answer) same(b answer) bool {
	a.elapsed, b.elapsed = 0, 0
	return a == b
}

func send(base string, ex exchange) answer {
	if ex.name == "early-101" {
		return sendEarly101(base, ex)
	}
	method := ex.method
	if method == "" {
		method = "GET"
	}
	var body io.Reader
	if ex.body != "" {
		body = strings.NewReader(ex.body)
		if ex.chunked {
			body = io.MultiReader(strings.NewReader(ex.body)) // hides the length
		}
	}
	req, _ := http.NewRequest(method, base+ex.path, body)
	if ex.chunked {
		req.Trailer = http.Header{"X-T": {"tv"}}
	}
	if ex.expect {
		req.Header.Set("Expect", "100-continue")
	}
	var a answer
	var informed []string
	req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
		Got1xxResponse: func(code int, _ textproto.MIMEHeader) error {
			informed = append(informed, strconv.Itoa(code))
			return nil
		},
	}))
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DisableKeepAlives:     true, // a new connection each time: the workers share them out
		ExpectContinueTimeout: 2 * time.Second,
	}}
	start := time.Now()
	resp, err := c.Do(req)
	if err != nil {
		a.status = -1
		a.body = err.Error()
		return a
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	a.elapsed = time.Since(start)
	a.status = resp.StatusCode
	a.bodyErr = err != nil
	for _, h := range []string{"Content-Type", "X-Script", "X-Method", "X-Req-Trailer", "Upgrade"} {
		if v := resp.Header.Get(h); v != "" {
			a.header += h + "=" + v + ";"
		}
	}
	a.body = fmt.Sprintf("%d:%x", len(b), sha256.Sum256(b))
	if len(b) < 40 {
		a.body = fmt.Sprintf("%d:%q", len(b), b)
	}
	a.trailer = resp.Trailer.Get("X-Sum")
	a.informed = strings.Join(informed, ",")
	return a
}

// sendEarly101 sends a request asking to upgrade whose body is still
// streaming when the upstream switches protocols, and reports the status.
func sendEarly101(base string, ex exchange) answer {
	hostport, prefix, _ := strings.Cut(strings.TrimPrefix(base, "http://"), "/")
	if prefix != "" {
		prefix = "/" + prefix
	}
	c, err := net.DialTimeout("tcp", hostport, 5*time.Second)
	if err != nil {
		return answer{status: -1, body: err.Error()}
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	const n = 1 << 20
	fmt.Fprintf(c, "POST %s%s HTTP/1.1\r\nHost: %s\r\nUpgrade: echo\r\nConnection: Upgrade\r\nContent-Length: %d\r\n\r\n", prefix, ex.path, hostport, n)
	go func() {
		chunk := bytes.Repeat([]byte("u"), 16<<10)
		for sent := 0; sent < n; sent += len(chunk) {
			if _, err := c.Write(chunk); err != nil {
				return
			}
			time.Sleep(time.Millisecond)
		}
	}()
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return answer{status: -1, body: "read response: " + strings.SplitN(err.Error(), ":", 2)[0]}
	}
	resp.Body.Close()
	return answer{status: resp.StatusCode, header: "Upgrade=" + resp.Header.Get("Upgrade") + ";"}
}

// diffSite is the site both the fleet and stock Caddy serve: one route to
// each upstream, the same but for the transport.
func diffSite(port int, plain, tlsUp, transport string) string {
	return fmt.Sprintf(`:%d {
	bind 127.0.0.1
	handle_path /tls/* {
		reverse_proxy https://%s {
			transport %s {
				tls_insecure_skip_verify
			}
		}
	}
	handle_path /limited/* {
		request_body {
			max_size 64KiB
		}
		reverse_proxy %s {
			transport %s
		}
	}
	handle {
		reverse_proxy %s {
			transport %s
		}
	}
}
`, port, tlsUp, transport, plain, transport, plain, transport)
}

// startStock runs stock Caddy with the http transport, stopped when the test
// ends.
func startStock(t *testing.T, site string) *exec.Cmd { return startStockWith(t, "", site) }

// startStockServing runs stock Caddy in front of upstream (host:port) on a
// free loopback port, and returns once it answers there with a 200.
func startStockServing(t *testing.T, upstream string) (*exec.Cmd, string) {
	t.Helper()
	port := freePort(t)
	stock := startStock(t, fmt.Sprintf(":%d {\n\tbind 127.0.0.1\n\treverse_proxy %s\n}\n", port, upstream))
	url := fmt.Sprintf("http://127.0.0.1:%d/", port)
	waitFor(t, 20*time.Second, "stock caddy to serve", func() bool {
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
		}
		return err == nil && resp.StatusCode == 200
	})
	return stock, url
}

// startStockWith is startStock with more global options.
func startStockWith(t *testing.T, global, site string) *exec.Cmd {
	bin := caddyBinary(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "Caddyfile")
	if err := os.WriteFile(cfg, []byte("{\n\tauto_https off\n\tadmin off\n\tgrace_period 3s\n"+global+"}\n"+site), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "run", "--config", cfg, "--adapter", "caddyfile")
	cmd.Env = append(os.Environ(), "XDG_CONFIG_HOME="+dir, "XDG_DATA_HOME="+dir)
	log := new(syncBuffer)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		cmd.Wait()
		close(done)
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-done
		if t.Failed() {
			t.Logf("stock caddy's log:\n%s", log.String())
		}
	})
	return cmd
}

// TestFleetDifferential: the same exchanges, one after another with idle gaps
// and then all at once, through a fleet of three workers and through stock
// Caddy, give the same answers, and no worker answers 502 where stock Caddy
// did not.
func TestFleetDifferential(t *testing.T) {
	plain := newScriptedUpstream(t, false)
	tlsUp := newScriptedUpstream(t, true)

	stockPort := freePort(t)
	startStock(t, diffSite(stockPort, plain.addr(), tlsUp.addr(), "http"))
	stock := fmt.Sprintf("http://127.0.0.1:%d", stockPort)

	f := newTestFleet(t, 3)
	cfg := fmt.Sprintf(`{
	auto_https off
	orbit_pool {
		segment %s
		max_conns_per_host 1
		wait_timeout 5s
		reconcile_interval 50ms
		workers 16
	}
}
`, f.segment) + diffSite(f.port, plain.addr(), tlsUp.addr(), "orbit_pool")
	if err := os.WriteFile(f.caddyfile, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	f.launch()
	fleet := f.url("")
	waitFor(t, 10*time.Second, "stock caddy to serve", func() bool { return send(stock, exchangeMatrix[0]).status == 200 })
	pids := []int{f.workerPID(0), f.workerPID(1), f.workerPID(2)}

	diffs, fleet502 := 0, 0
	quickestExpect := time.Hour
	check := func(round string, sequential bool, ex exchange, want, got answer) {
		if got.status == http.StatusBadGateway && want.status != http.StatusBadGateway {
			fleet502++
		}
		if ex.expect {
			// Whether a client the upstream refuses is first told to
			// continue depends, in stock Caddy too, on whether the
			// transport's first read of the body or the refusal comes
			// first; runs of stock Caddy differ. The timing is judged
			// below.
			want.informed = strings.TrimPrefix(want.informed, "100")
			got.informed = strings.TrimPrefix(got.informed, "100")
		}
		if !want.same(got) {
			diffs++
			t.Errorf("%s %s: fleet gave %v; stock gave %v", round, ex.name, got, want)
		}
		// Timed one at a time only: all at once, an exchange may wait its
		// turn for the one connection the fleet allows per upstream. Even
		// stock Caddy now and then drains the unread body before it
		// answers (the client then waits for its expect timeout), so the
		// fleet is judged by its quickest answer.
		if sequential && ex.expect {
			quickestExpect = min(quickestExpect, got.elapsed)
		}
	}
	rounds := 3
	if testing.Short() {
		rounds = 1
	}
	for _, prefix := range []string{"", "/tls"} {
		// The reference answers, one after another.
		want := map[string]answer{}
		for _, ex := range exchangeMatrix {
			time.Sleep(ex.gap)
			want[ex.name] = send(stock+prefix, ex)
		}
		for r := range rounds {
			round := fmt.Sprintf("upstream %q, sequential round %d:", prefix, r)
			for _, ex := range exchangeMatrix {
				time.Sleep(ex.gap)
				check(round, true, ex, want[ex.name], send(fleet+prefix, ex))
			}
		}
		// All at once, several times over: the answers do not depend on
		// what else shares the connection.
		for r := range rounds {
			round := fmt.Sprintf("upstream %q, concurrent round %d:", prefix, r)
			var mu sync.Mutex
			var wg sync.WaitGroup
			for _, ex := range exchangeMatrix {
				if ex.name == "smuggle" || strings.HasPrefix(ex.name, "after-") && ex.gap == 0 {
					// Smuggling is judged by the exchange after it on the same
					// connection, which only a sequence can name.
					continue
				}
				wg.Go(func() {
					got := send(fleet+prefix, ex)
					mu.Lock()
					check(round, false, ex, want[ex.name], got)
					mu.Unlock()
				})
			}
			wg.Wait()
		}
	}
	if quickestExpect > time.Second {
		t.Errorf("a refused Expect: 100-continue was answered at best after %v through the fleet; it should come at once", quickestExpect)
	}
	for i, pid := range pids {
		if pid == 0 || f.workerPID(i) != pid {
			t.Errorf("worker %d was restarted during the test (pid %d, now %d): it crashed", i, pid, f.workerPID(i))
		}
	}
	if diffs > 0 || fleet502 > 0 {
		t.Errorf("%d differences from stock Caddy, %d answers of 502 where stock had none", diffs, fleet502)
	}
}

// TestFleetEarlyAnswerEndsSiblingStream: an upstream that refuses a request
// before reading its body makes the owner end the sibling's stream (the
// unread body leaves it out of step). The sibling must not send its next
// request on that stream even when, on its side, the body went out whole;
// it did, and such a request failed with 502 "owner process gone" in about
// one round in ten.
func TestFleetEarlyAnswerEndsSiblingStream(t *testing.T) {
	plain := newScriptedUpstream(t, false)
	tlsUp := newScriptedUpstream(t, true)
	f := newTestFleet(t, 3)
	cfg := fmt.Sprintf(`{
	auto_https off
	orbit_pool {
		segment %s
		max_conns_per_host 1
		reconcile_interval 50ms
		workers 16
	}
}
`, f.segment) + diffSite(f.port, plain.addr(), tlsUp.addr(), "orbit_pool")
	if err := os.WriteFile(f.caddyfile, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	f.launch()
	seq := []exchange{
		{name: "malformed", path: "/malformed"},
		{name: "ok", path: "/ok"},
		{name: "expect-417", method: "PUT", path: "/expect-417", body: strings.Repeat("e", 16<<10), expect: true},
	}
	rounds := 100
	if testing.Short() {
		rounds = 20
	}
	failed := 0
	for r := range rounds {
		for _, ex := range seq {
			a := send(f.url("/tls"), ex)
			if ex.name != "malformed" && a.status != 200 && a.status != http.StatusExpectationFailed {
				if failed++; failed <= 3 {
					t.Errorf("round %d, %s: %v", r, ex.name, a)
				}
			}
		}
	}
	if failed > 0 {
		t.Errorf("%d of %d requests failed", failed, 2*rounds)
	}
}
