package proxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"strings"
	"testing"
	"time"
)

// A request with Expect: 100-continue whose body the client writes only
// once it has the response (a two-way stream) must get that response through
// a sibling as it does on the owner's own path. The zero-length read that
// tells such a client to continue blocks on its body until data comes, so it
// cannot be made on the goroutine that waits for the response.
func TestExpectStreamedBodyAfterResponseThroughSibling(t *testing.T) {
	h2 := newH2CServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/" {
			io.WriteString(w, "ok")
			return
		}
		w.WriteHeader(http.StatusOK)
		http.NewResponseController(w).Flush()
		b, _ := io.ReadAll(r.Body)
		io.WriteString(w, "got "+string(b))
	})
	// The same over HTTP/1.1, scripted: net/http's server reads a body
	// after its response began as full duplex, which Go 1.26 and 1.27 do
	// differently with Expect: 100-continue.
	h1 := rawUpstream(t, func(c net.Conn, br *bufio.Reader, req *http.Request) bool {
		if req.URL.Path == "/" {
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
			return true
		}
		io.WriteString(c, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
		b, err := io.ReadAll(req.Body)
		if err != nil {
			return false
		}
		fmt.Fprintf(c, "%x\r\ngot %s\r\n0\r\n\r\n", 4+len(b), b)
		return true
	})
	for _, c := range []struct {
		name, url string
		h2c       bool
		ect       time.Duration
	}{
		{"h1, no expect wait", h1, false, -1},
		{"h2c, expect timeout 1s", h2.url, true, time.Second},
	} {
		t.Run(c.name, func(t *testing.T) {
			owner, client := remotePair(t, func(tr *Transport) {
				tr.H2C = c.h2c
				tr.ExpectContinueTimeout = c.ect
			})
			warm(t, owner, c.url+"/")
			var ref http.RoundTripper = &http.Transport{} // no expect wait
			if c.h2c {
				ref = refH2C()
			}
			for _, m := range []struct {
				path string
				rt   http.RoundTripper
			}{{"reference", ref}, {"sibling", client.tr}, {"owner", owner.tr}} {
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				pr, pw := io.Pipe()
				req, _ := http.NewRequestWithContext(ctx, "POST", c.url+"/stream", pr)
				req.Header.Set("Expect", "100-continue")
				type result struct {
					resp *http.Response
					err  error
				}
				got := make(chan result, 1)
				go func() {
					resp, err := m.rt.RoundTrip(req)
					got <- result{resp, err}
				}()
				var resp *http.Response
				select {
				case r := <-got:
					resp = r.resp
					if r.err != nil {
						cancel()
						pw.Close()
						t.Fatalf("%s: %v; want the response the upstream sent before reading the body", m.path, r.err)
					}
				case <-time.After(5 * time.Second):
					cancel()
					pw.Close() // lets a RoundTrip blocked on the body return
					t.Fatalf("%s: RoundTrip still blocked 5s in, past its 2s deadline; want the response the upstream sent before reading the body", m.path)
				}
				io.WriteString(pw, "hello")
				pw.Close()
				b, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				cancel()
				if err != nil || string(b) != "got hello" {
					t.Errorf("%s: body %q, error %v; want %q", m.path, b, err, "got hello")
				}
			}
			if s := client.node.Stats(); s.ReusedRemote == 0 {
				t.Errorf("the sibling's request did not go through the owner: %+v", s)
			}
		})
	}
}

// A sibling that gives up on an Expect: 100-continue request while the owner
// still waits for the upstream's 100 frees the owner's connection at once, as
// a caller of the owner's own that gives up does, and not when the owner's
// expect timeout runs out: with one connection to the upstream, the next
// request would otherwise find none.
func TestExpectCancelledWhileOwnerWaitsFor100(t *testing.T) {
	const ect = 5 * time.Second
	url := rawUpstream(t, func(c net.Conn, br *bufio.Reader, req *http.Request) bool {
		if req.Method == "POST" {
			io.Copy(io.Discard, br) // sends no 100 and no answer
			return false
		}
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		return true
	})
	owner, client := remotePair(t, func(tr *Transport) { tr.ExpectContinueTimeout = ect })
	warm(t, owner, url+"/")
	for _, m := range []struct {
		path string
		m    *member
	}{{"owner", owner}, {"sibling", client}} {
		remote := client.node.Stats().ReusedRemote
		ctx, cancel := context.WithCancel(context.Background())
		req, _ := http.NewRequestWithContext(ctx, "POST", url+"/upload", strings.NewReader("hello"))
		req.Header.Set("Expect", "100-continue")
		stop := time.AfterFunc(100*time.Millisecond, cancel)
		resp, err := m.m.tr.RoundTrip(req)
		stop.Stop()
		cancel()
		if err == nil {
			resp.Body.Close()
			t.Fatalf("%s: the POST got %d from an upstream that never answers", m.path, resp.StatusCode)
		}
		if m.path == "sibling" && client.node.Stats().ReusedRemote == remote {
			t.Fatalf("the sibling's POST did not go through the owner: %+v", client.node.Stats())
		}
		start := time.Now()
		ctx, cancel = context.WithTimeout(context.Background(), time.Second)
		req, _ = http.NewRequestWithContext(ctx, "GET", url+"/", nil)
		resp, err = m.m.tr.RoundTrip(req)
		if err != nil {
			cancel()
			t.Fatalf("%s: the GET after a cancelled POST: %v after %v; want the connection the POST held freed at once, well within the %v expect timeout",
				m.path, err, time.Since(start).Round(time.Millisecond), ect)
		}
		drain(resp)
		cancel()
	}
}

// A sibling takes an https upstream for HTTP/1.1 when its own last
// connection chose it by ALPN (upstreamEntry.speaksH2), while the owner's
// connection is HTTP/2. A request expecting a 100 from an upstream that
// sends none waits for it as net/http's HTTP/2 client does, once: the
// sibling's writer until a relayed 100 or its ExpectContinueTimeout, the
// owner's stream until the same timeout of its own. Its trace reports the
// same wait for a 100 as net/http's for the same request.
func TestExpectSiblingGuessedHTTP1OwnerOnH2(t *testing.T) {
	const ect = time.Second
	ts, roots, owner, client, entry := h2TLSPair(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Method != "POST" {
			io.WriteString(w, "ok")
			return
		}
		// net/http's HTTP/2 server sends no 100 once a 103 has gone out.
		w.Header().Set("Link", "</style.css>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		b, _ := io.ReadAll(r.Body)
		io.WriteString(w, "got "+string(b))
	}, func(tr *Transport) { tr.ExpectContinueTimeout = ect })
	entry.spokeH1.Store(true) // as after a connection of its own chose http/1.1
	ref := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}, ForceAttemptHTTP2: true, ExpectContinueTimeout: ect}
	defer ref.CloseIdleConnections()
	waits := map[string]string{}
	for _, m := range []struct {
		path string
		rt   http.RoundTripper
	}{{"net/http", ref}, {"owner", owner.tr}, {"sibling", client.tr}} {
		// The events of the wait for a 100 alone: where a 1xx or the end
		// of the request's write falls among them is a race in net/http's
		// client too.
		ev := &adv60Trace{}
		ctx, cancel := context.WithTimeout(context.Background(), 5*ect)
		ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
			Wait100Continue: func() { ev.add("Wait100Continue") },
			Got100Continue:  func() { ev.add("Got100Continue") },
		})
		req, _ := http.NewRequestWithContext(ctx, "POST", ts.URL+"/upload", strings.NewReader("hello"))
		req.Header.Set("Expect", "100-continue")
		o := roundTripOutcome(m.rt, req)
		cancel()
		if o.status != 200 || o.body != "got hello" || o.proto != "HTTP/2.0" || o.duration < ect*2/3 || o.duration >= ect*9/5 {
			t.Errorf("%s: %s %d body %q error %q after %v; want HTTP/2.0 200 %q after the %v expect timeout, once, as net/http's client",
				m.path, o.proto, o.status, o.body, o.err, o.duration.Round(time.Millisecond), "got hello", ect)
		}
		waits[m.path] = ev.String()
	}
	if s := client.node.Stats(); s.ReusedRemote == 0 {
		t.Errorf("the sibling's request did not go through the owner: %+v", s)
	}
	for _, p := range []string{"owner", "sibling"} {
		if waits[p] != waits["net/http"] {
			t.Errorf("trace of the wait for a 100: %s %q, net/http %q; want net/http's", p, waits[p], waits["net/http"])
		}
	}
}

// h2TLSPair starts an https upstream that speaks HTTP/2 and serves GETs
// "ok", and an owner and a sibling (see remotePair) whose owner holds the
// connection; entry is the sibling's record of the upstream, whose
// spokeH1 is its guess of the protocol.
func h2TLSPair(t *testing.T, h http.HandlerFunc, conf func(*Transport)) (ts *httptest.Server, roots *x509.CertPool, owner, client *member, entry *upstreamEntry) {
	t.Helper()
	ts = httptest.NewUnstartedServer(h)
	ts.EnableHTTP2 = true
	ts.StartTLS()
	t.Cleanup(ts.Close)
	roots = x509.NewCertPool()
	roots.AddCert(ts.Certificate())
	owner, client = remotePair(t, func(tr *Transport) {
		tr.HTTP2 = true
		tr.TLSClientConfig = &tls.Config{RootCAs: roots}
		if conf != nil {
			conf(tr)
		}
	})
	if err := getOK(owner, context.Background(), ts.URL+"/"); err != nil {
		t.Fatal(err)
	}
	probe, _ := http.NewRequest("POST", ts.URL+"/", nil)
	entry, err := client.tr.upstream(probe)
	if err != nil {
		t.Fatal(err)
	}
	return ts, roots, owner, client, entry
}
