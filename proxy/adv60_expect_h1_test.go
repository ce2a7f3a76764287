package proxy

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"strings"
	"sync"
	"testing"
	"time"
)

// adv60Trace records the request-side trace events of an exchange, in
// order.
type adv60Trace struct {
	mu     sync.Mutex
	events []string
}

func (r *adv60Trace) add(s string) {
	r.mu.Lock()
	r.events = append(r.events, s)
	r.mu.Unlock()
}

func (r *adv60Trace) String() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return strings.Join(r.events, " ")
}

func (r *adv60Trace) context(ctx context.Context) context.Context {
	return httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		WroteHeaders:    func() { r.add("WroteHeaders") },
		Wait100Continue: func() { r.add("Wait100Continue") },
		Got100Continue:  func() { r.add("Got100Continue") },
		WroteRequest: func(i httptrace.WroteRequestInfo) {
			r.add(fmt.Sprintf("WroteRequest(err=%v)", i.Err))
		},
	})
}

// TestAdv60ExpectWroteRequestOnce: a PUT with Expect: 100-continue and a
// 5-byte body, to an HTTP/1.1 upstream that sends 100 Continue, reads the
// body and answers 200, reports WroteRequest once through net/http.Transport
// and twice both on the local path (owner.tr) and through a sibling
// (client.tr).
//
// Request.Write itself reports WroteRequest (a deferred call in net/http's
// Request.write), which net/http's Transport relies on; the exchange's
// writeRequest reported it again after r.Write returned. Nothing about the
// request needed Expect for this: every traced request with WroteRequest
// was reported twice.
func TestAdv60ExpectWroteRequestOnce(t *testing.T) {
	const ect = 2 * time.Second
	url := rawUpstream(t, func(c net.Conn, br *bufio.Reader, req *http.Request) bool {
		if req.Method == "PUT" {
			io.WriteString(c, "HTTP/1.1 100 Continue\r\n\r\n")
		}
		b, err := io.ReadAll(req.Body)
		if err != nil {
			return false
		}
		s := "got " + string(b)
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(s), s)
		return true
	})
	ref, paths := adv60Paths(t, url, ect)
	wantBody, want := adv60Put(t, ref, url)
	if wantBody != "200 got hello" || strings.Count(want, "WroteRequest") != 1 || !strings.Contains(want, "Got100Continue") {
		t.Fatalf("net/http: answer %q, trace %s", wantBody, want)
	}
	for _, p := range paths {
		body, got := adv60Put(t, p.rt, url)
		if body != wantBody {
			t.Errorf("%s: answer %q, want %q", p.name, body, wantBody)
		}
		if n := strings.Count(got, "WroteRequest"); n != 1 {
			t.Errorf("%s: WroteRequest reported %d times, net/http once:\n got  %s\n want %s", p.name, n, got, want)
		}
	}
}

// TestAdv60ExpectRefusedKeepAliveReusedThroughSibling: a PUT with Expect:
// 100-continue and a 5-byte body, to an HTTP/1.1 upstream that answers 417
// (keep-alive, Content-Length: 2) without sending 100 and before reading the
// body, then reads the body and serves the next request on the same
// connection. net/http.Transport sends the body after the 417 (the
// connection stays open) and reuses the connection for the next GET; so does
// the owner's local path. Through a sibling the upstream connection is
// closed: the next GET needs a new one, every time. The sibling's trace also
// reports WroteRequest with an error where net/http reports none.
//
// Reading of the cause: the owner relays the 417's head as soon as its
// exchange returns it, while the sibling still holds the body (it waits for
// the relayed head to learn whether to send it, exchange.go:561-566), so
// relay.response finds the peer's body unread and marks the head
// headStreamEnds (relay.go:363-366); serveOne then ends the stream
// (server.go:1047: rl.keepStream and reqDone.isDone() are false), and
// the owner's upstream writer, which net/http's rule told to send the body
// (exchange.go:564), loses the body's source mid-request, so the upstream
// connection is torn down. The same happens to 401 and 413 answered
// without reading, and to 100 followed at once by a final response.
func TestAdv60ExpectRefusedKeepAliveReusedThroughSibling(t *testing.T) {
	const ect = 2 * time.Second
	var mu sync.Mutex
	conns := 0
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	serveConns(t, ln, func(c net.Conn, id int) {
		mu.Lock()
		conns = id
		mu.Unlock()
		br := bufio.NewReader(c)
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			if req.Method == "PUT" {
				io.WriteString(c, "HTTP/1.1 417 Expectation Failed\r\nContent-Length: 2\r\n\r\nno")
			} else {
				io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
			}
			// The body follows the answer: read it before the next request.
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			_, err = io.Copy(io.Discard, req.Body)
			c.SetReadDeadline(time.Time{})
			if err != nil {
				return
			}
		}
	})
	url := "http://" + ln.Addr().String()
	accepted := func() int {
		mu.Lock()
		defer mu.Unlock()
		return conns
	}
	exchange := func(rt http.RoundTripper) (string, string) {
		// adv60Put leaves the body time to go out after the answer.
		answer, trace := adv60Put(t, rt, url)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		greq, _ := http.NewRequestWithContext(ctx, "GET", url+"/get", nil)
		gresp, err := rt.RoundTrip(greq)
		if err != nil {
			t.Fatalf("GET: %v", err)
		}
		drain(gresp)
		return answer, trace
	}

	ref := &http.Transport{ExpectContinueTimeout: ect}
	want, wantTrace := exchange(ref)
	ref.CloseIdleConnections()
	if want != "417 no" || accepted() != 1 {
		t.Fatalf("net/http: %q on %d connections, want 417 on one reused connection", want, accepted())
	}
	if !strings.Contains(wantTrace, "WroteRequest(err=<nil>)") {
		t.Fatalf("net/http trace: %s", wantTrace)
	}

	owner, _ := remotePair(t, func(tr *Transport) { tr.ExpectContinueTimeout = ect })
	base := accepted()
	if got, _ := exchange(owner.tr); got != want || accepted() != base+1 {
		t.Fatalf("owner (local): %q, %d new connections for the PUT and the GET, want %q on one", got, accepted()-base, want)
	}
	// Each round has a pair of its own, whose owner makes the one
	// connection: the sibling's PUT goes over it, and so should its GET,
	// as the local path's did.
	const rounds = 5
	lost := 0
	var traces []string
	for i := range rounds {
		owner, client := remotePair(t, func(tr *Transport) { tr.ExpectContinueTimeout = ect })
		warm(t, owner, url+"/get")
		before, remote := accepted(), client.node.Stats().ReusedRemote
		got, trace := exchange(client.tr)
		if got != want {
			t.Fatalf("sibling round %d: %q, want %q", i, got, want)
		}
		if client.node.Stats().ReusedRemote == remote {
			t.Fatalf("sibling round %d: the PUT did not go through the owner", i)
		}
		if accepted() != before {
			lost++
		}
		if !strings.Contains(trace, "WroteRequest(err=<nil>)") {
			traces = append(traces, trace)
		}
	}
	if lost > 0 {
		t.Errorf("sibling: %d of %d rounds (417 keep-alive, then GET) needed a new upstream connection; net/http and the local path reuse it", lost, rounds)
	}
	if len(traces) > 0 {
		t.Errorf("sibling: %d of %d rounds reported WroteRequest with an error, net/http with none:\n got  %s\n want %s", len(traces), rounds, traces[0], wantTrace)
	}
}

// TestAdv60ExpectSkippedBodyWroteRequestNoError: a PUT with Expect:
// 100-continue and a 5-byte body, to an HTTP/1.1 upstream that answers 417
// with Connection: close without sending 100. No path sends the body (the
// connection closes), and net/http.Transport reports WroteRequest with no
// error: Request.write returns nil when waitForContinue says not to send
// the body. The local path (owner.tr) and a sibling (client.tr) report
// WroteRequest with an error, "request body not sent: final response
// before 100-continue": continueBody.Read returns errSkipBody
// (proxy/exchange.go:904-906), which Request.Write reports through the
// trace as a failed write, and writeRequest (proxy/exchange.go:338-339) again.
func TestAdv60ExpectSkippedBodyWroteRequestNoError(t *testing.T) {
	const ect = 2 * time.Second
	url := rawUpstream(t, func(c net.Conn, br *bufio.Reader, req *http.Request) bool {
		if req.Method != "PUT" {
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
			return true
		}
		io.WriteString(c, "HTTP/1.1 417 Expectation Failed\r\nConnection: close\r\nContent-Length: 2\r\n\r\nno")
		return false
	})
	ref, paths := adv60Paths(t, url, ect)
	want, wantTrace := adv60Put(t, ref, url)
	if want != "417 no" || wantTrace != "WroteHeaders Wait100Continue WroteRequest(err=<nil>)" {
		t.Fatalf("net/http: %q, trace %s", want, wantTrace)
	}
	for _, p := range paths {
		got, trace := adv60Put(t, p.rt, url)
		if got != want {
			t.Errorf("%s: %q, want %q", p.name, got, want)
		}
		if strings.Contains(trace, "WroteRequest(err=") && !strings.Contains(trace, "WroteRequest(err=<nil>)") {
			t.Errorf("%s: WroteRequest reports an error for a body net/http skips without one:\n got  %s\n want %s", p.name, trace, wantTrace)
		}
	}
}

// adv60Paths returns net/http's Transport and orbit's two paths (an owner's
// local one and its sibling's), all with ExpectContinueTimeout ect, the
// owner holding a connection to url.
func adv60Paths(t *testing.T, url string, ect time.Duration) (*http.Transport, []adv60Path) {
	t.Helper()
	ref := &http.Transport{ExpectContinueTimeout: ect}
	t.Cleanup(ref.CloseIdleConnections)
	owner, client := remotePair(t, func(tr *Transport) { tr.ExpectContinueTimeout = ect })
	warm(t, owner, url+"/")
	return ref, []adv60Path{{"owner (local)", owner.tr}, {"sibling", client.tr}}
}

type adv60Path struct {
	name string
	rt   http.RoundTripper
}

// adv60Put sends url's upstream a traced PUT of "hello" with Expect:
// 100-continue, and returns the answer ("status body") and, once the
// writer has had time to report after the response, the trace.
func adv60Put(t *testing.T, rt http.RoundTripper, url string) (answer, trace string) {
	t.Helper()
	var tr adv60Trace
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(tr.context(ctx), "PUT", url+"/put", strings.NewReader("hello"))
	req.Header.Set("Expect", "100-continue")
	resp, err := rt.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	return fmt.Sprintf("%d %s", resp.StatusCode, b), tr.String()
}
