package caddymodule

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// Adversarial tests of the kept short body (body.go) and the read-ahead
// before the wait timeout and deadline (transport.go RoundTrip), each run
// against the stock `http` transport in the same in-process Caddy.

// advSite is a site on port proxying to upstreams with transport kind
// ("orbit_pool" or "http"); extra goes into the reverse_proxy block.
func advSite(port int, upstreams, kind, extra string) string {
	return fmt.Sprintf(`:%d {
	bind 127.0.0.1
	reverse_proxy %s {
		transport %s
		%s
	}
}
`, port, upstreams, kind, extra)
}

var advKinds = []string{"http", "orbit_pool"}

// h2cPost sends, over h2c prior knowledge, a POST with content-length n and
// the body's n bytes in one DATA frame WITHOUT END_STREAM, and waits up to
// wait for the response's HEADERS. It returns the :status ("" if none came)
// and a func that ends the stream and closes the connection.
func h2cPost(t *testing.T, port int, body string, wait time.Duration) (status string, done func()) {
	t.Helper()
	c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(c, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(c, c)
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	fr.WriteSettings()
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for _, kv := range [][2]string{
		{":method", "POST"}, {":scheme", "http"}, {":authority", "localhost"}, {":path", "/"},
		{"content-length", fmt.Sprint(len(body))},
	} {
		enc.WriteField(hpack.HeaderField{Name: kv[0], Value: kv[1]})
	}
	fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: hb.Bytes(), EndHeaders: true})
	fr.WriteData(1, false, []byte(body)) // the whole declared body, stream left open
	c.SetReadDeadline(time.Now().Add(wait))
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			break
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				fr.WriteSettingsAck()
			}
		case *http2.MetaHeadersFrame:
			if f.StreamID == 1 {
				status = f.PseudoValue("status")
			}
		case *http2.RSTStreamFrame, *http2.GoAwayFrame:
			status = fmt.Sprintf("%T", f)
		}
		if status != "" {
			break
		}
	}
	return status, func() {
		fr.WriteData(1, true, nil)
		c.Close()
	}
}

// TestAdvH2BodyWholeStreamOpen: an HTTP/2 client sends the whole declared
// body (content-length 5, one DATA frame) but ends its stream only once the
// response has begun. Stock sends head and body upstream at once and the
// upstream answers; the read-ahead's second Read (only "to see EOF") waits
// for END_STREAM, which never comes before the response, and the wait
// timeout and deadline have not started.
func TestAdvH2BodyWholeStreamOpen(t *testing.T) {
	up := newUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "got %s", b)
	}), false)
	for _, kind := range advKinds {
		t.Run(kind, func(t *testing.T) {
			port := freePort(t)
			startCaddyGlobal(t, "servers {\n\t\tprotocols h1 h2c\n\t}", "",
				advSite(port, up.hostport(), kind, "")+"")
			start := time.Now()
			status, done := h2cPost(t, port, "hello", 3*time.Second)
			defer done()
			if status != "200" {
				t.Errorf("%s: h2 POST with its whole declared body, stream left open: status %q after %s; want 200 (as stock)",
					kind, status, time.Since(start).Round(time.Millisecond))
			}
		})
	}
}

// recorder records the bodies an upstream received.
type recorder struct {
	mu     sync.Mutex
	bodies []string
}

func (r *recorder) add(s string) { r.mu.Lock(); r.bodies = append(r.bodies, s); r.mu.Unlock() }
func (r *recorder) get() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.bodies...)
}

// TestAdvResponseRetryPOST: lb_retry_match on a response status retries a
// POST that the first upstream READ IN FULL and answered 503. Stock's body is
// spent by then (the first attempt closed it), so the retry carries a broken
// body (the upstream sees unexpected EOF); with the kept body the retry
// delivers the complete POST a second time. Property asserted: a POST body
// that an upstream read in full and answered is not delivered in full again.
func TestAdvResponseRetryPOST(t *testing.T) {
	whole := map[string]int{}
	for _, kind := range advKinds {
		t.Run(kind, func(t *testing.T) {
			var r1 recorder
			u1 := newUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				b, err := io.ReadAll(r.Body)
				r1.add(fmt.Sprintf("%q err=%v", b, err))
				w.WriteHeader(503)
			}), false)
			port := freePort(t)
			startCaddy(t, "", advSite(port, u1.hostport(), kind,
				"lb_retries 1\n\t\tlb_retry_match {\n\t\t\texpression `{rp.status_code} == 503`\n\t\t}"))
			resp, err := client.Post(fmt.Sprintf("http://127.0.0.1:%d/", port), "text/plain", strings.NewReader("pay-once"))
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			t.Logf("%s: client got %d %q; upstream got %v", kind, resp.StatusCode, b, r1.get())
			for _, s := range r1.get() {
				if s == `"pay-once" err=<nil>` {
					whole[kind]++
				}
			}
		})
	}
	t.Logf("complete POST bodies delivered: stock %d, orbit_pool %d", whole["http"], whole["orbit_pool"])
	for kind, n := range whole {
		if n > 1 {
			t.Errorf("%s: a POST the upstream read in full and answered was delivered in full %d times", kind, n)
		}
	}
}

// TestAdvGETBodyTransportErrorRetry: a GET with a body (retried by default on
// any transport error) whose first upstream read the whole body and then
// closed the connection without answering.
func TestAdvGETBodyTransportErrorRetry(t *testing.T) {
	got := map[string][]string{}
	for _, kind := range advKinds {
		t.Run(kind, func(t *testing.T) {
			var r1, r2 recorder
			u1 := newUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				b, err := io.ReadAll(r.Body)
				r1.add(fmt.Sprintf("%q err=%v", b, err))
				c, _, herr := http.NewResponseController(w).Hijack()
				if herr == nil {
					c.Close()
				}
			}), false)
			u2 := newUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				b, err := io.ReadAll(r.Body)
				r2.add(fmt.Sprintf("%q err=%v", b, err))
				fmt.Fprintf(w, "u2 %s", b)
			}), false)
			port := freePort(t)
			startCaddy(t, "", advSite(port, u1.hostport()+" "+u2.hostport(), kind,
				"lb_policy first\n\t\tlb_retries 1"))
			req, _ := http.NewRequest("GET", fmt.Sprintf("http://127.0.0.1:%d/", port), strings.NewReader("query"))
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			t.Logf("%s: client got %d %q; u1 got %v; u2 got %v", kind, resp.StatusCode, b, r1.get(), r2.get())
			got[kind] = append([]string{fmt.Sprint(resp.StatusCode)}, r2.get()...)
			if kind == "orbit_pool" && len(r1.get()) != 1 {
				// Stock sends the retry, with what is left of the
				// body, now and then.
				t.Errorf("the first upstream got %d requests, %v; the retry must not send a body read already", len(r1.get()), r1.get())
			}
		})
	}
	if fmt.Sprint(got["http"]) != fmt.Sprint(got["orbit_pool"]) {
		t.Fatalf("a GET with a body, retried after a transport error: stock [status, u2's bodies] %v, orbit_pool %v",
			got["http"], got["orbit_pool"])
	}
	// And no second upstream gets a body other than the client's.
	for k, v := range got {
		for _, s := range v[1:] {
			if s != `"query" err=<nil>` && !strings.Contains(s, "err=unexpected EOF") {
				t.Errorf("%s: second upstream got %s", k, s)
			}
		}
	}
}

// TestAdvClientAbortMidBody: a client declares 100 bytes, sends 10, and
// closes. With two upstreams, lb_retries and max_fails 1, how many upstreams
// are marked down by this one client? Stock counts one failure (a non-dial
// error for a POST is not retried).
func TestAdvClientAbortMidBody(t *testing.T) {
	down := map[string]int{}
	for _, kind := range advKinds {
		t.Run(kind, func(t *testing.T) {
			var r1, r2 recorder
			u1 := newUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				b, err := io.ReadAll(r.Body)
				r1.add(fmt.Sprintf("%q err=%v", b, err))
				fmt.Fprint(w, "u1")
			}), false)
			u2 := newUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				b, err := io.ReadAll(r.Body)
				r2.add(fmt.Sprintf("%q err=%v", b, err))
				fmt.Fprint(w, "u2")
			}), false)
			port := freePort(t)
			startCaddy(t, "", advSite(port, u1.hostport()+" "+u2.hostport(), kind,
				"lb_policy first\n\t\tlb_retries 3\n\t\tfail_duration 30s\n\t\tmax_fails 1"))
			c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
			if err != nil {
				t.Fatal(err)
			}
			io.WriteString(c, "POST / HTTP/1.1\r\nHost: localhost\r\nContent-Length: 100\r\n\r\n0123456789")
			time.Sleep(200 * time.Millisecond)
			c.Close()
			time.Sleep(500 * time.Millisecond)
			// Two clean GETs: each upstream still up answers.
			ok := 0
			for i := 0; i < 2; i++ {
				resp, body := get(t, fmt.Sprintf("http://127.0.0.1:%d/", port))
				t.Logf("%s: GET %d: %d %q", kind, i, resp.StatusCode, body)
				if resp.StatusCode == 200 {
					ok++
				}
			}
			n := 0
			if ok == 0 {
				n = 2
			} else {
				resp, body := get(t, fmt.Sprintf("http://127.0.0.1:%d/", port))
				if body == "u2" {
					n = 1 // u1 is down
				}
				_ = resp
			}
			down[kind] = n
			t.Logf("%s: upstreams marked down by one aborted client: %d; u1 %v u2 %v", kind, n, r1.get(), r2.get())
		})
	}
	if down["orbit_pool"] > down["http"] {
		t.Errorf("one client aborting its body marked %d upstreams down under orbit_pool, %d under stock", down["orbit_pool"], down["http"])
	}
}
