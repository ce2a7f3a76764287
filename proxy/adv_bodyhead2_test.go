package proxy

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/backpressure"
	"github.com/orbitproxy/orbit/governor"
	"github.com/orbitproxy/orbit/internal/grpcmsg"
)

// hangUpstream counts the requests to each path (with their body), and
// holds each request to /hang until release is closed, its context ends, or
// 3 s pass; arrived gets one value per request that reached the handler.
type hangUpstream struct {
	srv     *httptest.Server
	mu      sync.Mutex
	seen    map[string]int
	arrived chan struct{}
	release chan struct{}
}

func newHangUpstream(t *testing.T) *hangUpstream {
	u := &hangUpstream{seen: map[string]int{}, arrived: make(chan struct{}, 16), release: make(chan struct{})}
	u.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if r.URL.Path == "/hang" {
			u.mu.Lock()
			u.seen[r.Method+" "+string(b)]++
			u.mu.Unlock()
			u.arrived <- struct{}{}
			select {
			case <-u.release:
			case <-r.Context().Done():
			case <-time.After(3 * time.Second):
			}
		}
		io.WriteString(w, "ok")
	}))
	t.Cleanup(func() {
		select {
		case <-u.release:
		default:
			close(u.release)
		}
		u.srv.CloseClientConnections()
		u.srv.Close()
	})
	return u
}

func (u *hangUpstream) count(key string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.seen[key]
}

// TestAdv2ShutdownTimeoutDoesNotReplayPOST: an owner that leaves the fleet
// by Shutdown, whose ctx ends while it still runs a sibling's exchange,
// closes that stream. The sibling's POST has reached the upstream already
// (the upstream is holding its answer): it must not be told "refused,
// retry-safe" and sent again, or the upstream acts on it twice.
//
// The body variants: with its head (short, whole), streamed
// (long), and none (Content-Length 0: no accept frame goes out before the
// answer either).
func TestAdv2ShutdownTimeoutDoesNotReplayPOST(t *testing.T) {
	for _, tc := range []struct {
		name  string
		body  string
		close bool // Close rather than Shutdown: the control
	}{
		{"short-body", "short-payload", false},
		{"long-body", strings.Repeat("L", 6000), false},
		{"no-body", "", false},
		{"close-short-body", "short-payload", true},
		{"close-no-body", "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := newHangUpstream(t)
			owner, client := remotePair(t, nil)
			warm(t, owner, u.srv.URL+"/warm")

			var body io.Reader
			if tc.body != "" {
				body = io.NopCloser(strings.NewReader(tc.body))
			}
			req, _ := http.NewRequest("POST", u.srv.URL+"/hang", body)
			req.ContentLength = int64(len(tc.body))
			done := sendAsync(client.tr, req)
			select {
			case <-u.arrived:
			case <-time.After(5 * time.Second):
				t.Fatal("the POST never reached the upstream")
			}
			if st := client.node.Stats(); st.ReusedRemote < 1 {
				t.Fatalf("not sent through the owner: %+v", st)
			}
			if tc.close {
				owner.node.Close()
			} else {
				sctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
				owner.node.Shutdown(sctx)
				cancel()
			}
			var r roundTripResult
			select {
			case r = <-done:
			case <-time.After(8 * time.Second):
				t.Fatal("the POST hung")
			}
			// Let a replay, if any, reach the handler.
			time.Sleep(200 * time.Millisecond)
			if n := u.count("POST " + tc.body); n != 1 {
				t.Fatalf("the upstream saw the POST %d times (client got %q, %v); a POST that reached the upstream was sent again",
					n, r.body, r.err)
			}
		})
	}
}

// TestAdv2BudgetRefusalClosesBodyOnce: a short POST whose admission times
// out (the Limiter is full): RoundTrip closes the client's body, once, as it
// does a long body's, though the read-ahead has closed it already.
func TestAdv2BudgetRefusalClosesBodyOnce(t *testing.T) {
	u := newTestUpstream(t)
	lim := backpressure.New(backpressure.WithCap(1))
	held, err := lim.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release()
	tr := localTransport(t, func(tr *Transport) { tr.Limiter = lim })
	for _, tc := range []struct {
		name string
		body string
	}{
		{"short", "hello"},
		{"long", strings.Repeat("x", 5000)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := &splitReader{parts: []string{tc.body}}
			ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, "POST", u.url("/echo"), src)
			req.ContentLength = int64(len(tc.body))
			_, err := tr.RoundTrip(req)
			if err == nil {
				t.Fatal("admitted past a full Limiter")
			}
			if c := src.closed.Load(); c != 1 {
				t.Fatalf("the client's body was closed %d times after %v; want once", c, err)
			}
		})
	}
}

// ownerAnswer is one answer the owner wrote on a stream, as a caller reads
// it: the frame's type and flags, and for an accept the response's status
// and body.
type ownerAnswer struct {
	typ    frameType
	flags  uint16
	status int
	body   string
}

// scriptServer is a real owner (server) over scriptAcceptor.
func scriptServer(t *testing.T) string {
	t.Helper()
	path := SocketPath(filepath.Join(t.TempDir(), "sock"), 1)
	ln, err := listenUnix(path)
	if err != nil {
		t.Fatal(err)
	}
	srv := newServer(ln, scriptAcceptor{}, nil)
	go srv.serve()
	t.Cleanup(func() { srv.close() })
	return path
}

// converse writes in to a fresh stream to the owner at path, half-closes
// it unless keepOpen, and reads the owner's answers until it ends the
// stream (or 5 s pass, then timedOut).
func converse(t *testing.T, path string, in string, keepOpen bool) (answers []ownerAnswer, timedOut bool) {
	t.Helper()
	c, err := net.DialTimeout("unix", path, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, in); err != nil {
		t.Fatal(err)
	}
	if !keepOpen {
		c.(*net.UnixConn).CloseWrite()
	}
	br := bufio.NewReader(c)
	for {
		f, err := readFrame(br, respHeaderLen, decodeResponseFrame)
		if err != nil {
			return answers, errors.Is(err, os.ErrDeadlineExceeded)
		}
		a := ownerAnswer{typ: f.typ, flags: f.flags}
		if f.typ == frameAccept {
			if _, _, _, err := readHead(br); err != nil {
				t.Fatalf("after an accept: %v", err)
			}
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("after an accept: %v", err)
			}
			b, _ := io.ReadAll(resp.Body)
			a.status, a.body = resp.StatusCode, string(b)
		}
		answers = append(answers, a)
	}
}

// TestAdv2OwnerNoFlagSequence: frames without flagBodyOnAccept (a short
// body sent with its head), refused, failed and served back to back on one
// stream, then an ordinary frame: the owner answers each in order, keeps
// the stream in step throughout, and ends it when the peer half-closes.
func TestAdv2OwnerNoFlagSequence(t *testing.T) {
	path := scriptServer(t)
	post := "POST /p HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello"
	get := "GET / HTTP/1.1\r\nHost: x\r\n\r\n"
	big := "POST /b HTTP/1.1\r\nHost: x\r\nContent-Length: 4096\r\n\r\n" + strings.Repeat("z", 4096)
	in := reqFrame("Rlease", 0) + post +
		reqFrame("Elease", 0) + post +
		reqFrame("lease", 0) + post +
		reqFrame("Rlease", 0) + big +
		reqFrame("lease", 0) + big +
		reqFrame("lease", flagBodyOnAccept) + get
	answers, timedOut := converse(t, path, in, false)
	want := []ownerAnswer{
		{typ: frameReject},
		{typ: frameError, flags: flagNothingSent},
		{typ: frameAccept, status: 200, body: "POST 5"},
		{typ: frameReject},
		{typ: frameAccept, status: 200, body: "POST 4096"},
		{typ: frameAccept, status: 200, body: "GET 0"},
	}
	if timedOut {
		t.Fatalf("the owner did not end the stream after the half-close; answers %+v", answers)
	}
	if len(answers) != len(want) {
		t.Fatalf("answers %+v; want %+v", answers, want)
	}
	for i := range want {
		if answers[i] != want[i] {
			t.Fatalf("answer %d: %+v; want %+v (all: %+v)", i, answers[i], want[i], answers)
		}
	}
}

// TestAdv2OwnerLyingPeer: peers that break the no-flag contract. The owner
// must neither hang past the half-close, nor answer a request whose body it
// did not get whole, nor read another request's bytes as this one's.
func TestAdv2OwnerLyingPeer(t *testing.T) {
	path := scriptServer(t)
	for _, tc := range []struct {
		name string
		in   string
		want []ownerAnswer
	}{
		// Fewer bytes than declared, then the end: no answer at all.
		{"short-then-eof", reqFrame("lease", 0) + "POST /p HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhel", nil},
		// The lease is judged only once the body sent with the head is in
		// (see awaitHead): a body that never comes whole is not answered,
		// even by the refusal the lease would have had.
		{"short-refused", reqFrame("Rlease", 0) + "POST /p HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhel", nil},
		// More bytes than declared: they are not a frame; this request
		// is answered, then the stream ends.
		{"long", reqFrame("lease", 0) + "POST /p HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhelloEXTRA",
			[]ownerAnswer{{typ: frameAccept, status: 200, body: "POST 5"}}},
		// Over maxBodyWithHead without the flag: streamed as an older
		// caller's; a refusal ends the stream.
		{"over-4k", reqFrame("lease", 0) + "POST /p HTTP/1.1\r\nHost: x\r\nContent-Length: 4097\r\n\r\n" + strings.Repeat("y", 4097) +
			reqFrame("lease", flagBodyOnAccept) + "GET / HTTP/1.1\r\nHost: x\r\n\r\n",
			[]ownerAnswer{{typ: frameAccept, status: 200, body: "POST 4097"}, {typ: frameAccept, status: 200, body: "GET 0"}}},
		{"over-4k-refused", reqFrame("Rlease", 0) + "POST /p HTTP/1.1\r\nHost: x\r\nContent-Length: 4097\r\n\r\n" + strings.Repeat("y", 4097) +
			reqFrame("lease", flagBodyOnAccept) + "GET / HTTP/1.1\r\nHost: x\r\n\r\n",
			[]ownerAnswer{{typ: frameReject}}},
		// Chunked without the flag: not read ahead.
		{"chunked-failed", reqFrame("Elease", 0) + "POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n" +
			reqFrame("lease", flagBodyOnAccept) + "GET / HTTP/1.1\r\nHost: x\r\n\r\n",
			[]ownerAnswer{{typ: frameError, flags: flagNothingSent}}},
		// Content-Length and Transfer-Encoding: refused by ReadRequest, or
		// read chunked; never read ahead by the length.
		{"cl-and-te", reqFrame("lease", 0) + "POST /c HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
			nil},
		// A body-less request without the flag, refused: the stream ends.
		{"get-refused", reqFrame("Rlease", 0) + "GET / HTTP/1.1\r\nHost: x\r\n\r\n" +
			reqFrame("lease", flagBodyOnAccept) + "GET / HTTP/1.1\r\nHost: x\r\n\r\n",
			[]ownerAnswer{{typ: frameReject}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			answers, timedOut := converse(t, path, tc.in, false)
			if timedOut {
				t.Fatalf("the owner did not end the stream after the half-close; answers %+v", answers)
			}
			if tc.name == "cl-and-te" {
				for _, a := range answers {
					if a.typ == frameAccept && a.body == "POST 3" {
						t.Fatalf("the owner framed a CL+TE body by its length: %+v", answers)
					}
				}
				return
			}
			// over-4k's GET is sent, and the stream half-closed, before
			// the POST's answer. If the POST's exchange runs past
			// watchDelay (a loaded machine), the watch reads the
			// half-close as the peer leaving, and the GET, buffered by
			// then, is not answered: the stream ends after the POST's
			// answer, which is still whole and the POST's.
			firstOnly := tc.name == "over-4k" && len(answers) == 1
			if len(answers) != len(tc.want) && !firstOnly {
				t.Fatalf("answers %+v; want %+v", answers, tc.want)
			}
			for i := range answers {
				if answers[i] != tc.want[i] {
					t.Fatalf("answer %d: %+v; want %+v", i, answers[i], tc.want[i])
				}
			}
		})
	}
}

// TestAdv2OwnerStalledShortBodyBoundedByDeadline: a peer sends a no-flag
// frame whose deadline is 300ms away, and the head and part of a short
// body, then nothing (without closing): the owner gives up by the frame's
// deadline (plus its grace), not after peerHeadTimeout.
func TestAdv2OwnerStalledShortBodyBoundedByDeadline(t *testing.T) {
	path := scriptServer(t)
	b, _ := appendRequestFrame(nil, []byte("lease"), time.Now().Add(300*time.Millisecond), 0)
	in := string(b) + "POST /p HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhe"
	start := time.Now()
	answers, timedOut := converse(t, path, in, true)
	if timedOut || time.Since(start) > 2*time.Second {
		t.Fatalf("the owner held a stalled short body %v (answers %+v)", time.Since(start), answers)
	}
	if len(answers) != 0 {
		t.Fatalf("the owner answered a request whose body it did not get: %+v", answers)
	}
}

// serverBodies hands each request's body on as a server does: no GetBody,
// a body Transport cannot see into, the declared length kept.
type serverBodies struct{ rt http.RoundTripper }

func (s serverBodies) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Body != nil && req.Body != http.NoBody {
		r := *req
		r.Body = io.NopCloser(req.Body)
		r.GetBody = nil
		req = &r
	}
	return s.rt.RoundTrip(req)
}

// TestAdv2DifferentialShortBodies: TestDifferential's comparison with
// net/http, for requests whose short body a server hands on (read ahead,
// with its head), to upstreams that answer oddly, on the local and the
// remote path.
func TestAdv2DifferentialShortBodies(t *testing.T) {
	u := newTestUpstream(t)
	local := serverBodies{localTransport(t, configure)}
	owner, client := remotePair(t, configure)
	remote := serverBodies{client.tr}
	cases := []diffCase{
		{name: "post", method: "POST", path: "/echo", body: "a=1&b=2"},
		{name: "post-4096", method: "POST", path: "/echo", body: strings.Repeat("q", 4096)},
		{name: "post-4097", method: "POST", path: "/echo", body: strings.Repeat("q", 4097)},
		{name: "get-with-body", path: "/echo", body: "g"},
		{name: "delete-with-body", method: "DELETE", path: "/echo", body: "d"},
		{name: "head-with-body", method: "HEAD", path: "/head", body: "h"},
		{name: "post-gzip", method: "POST", path: "/gzip", body: "z"},
		{name: "post-1xx", method: "POST", path: "/1xx", body: "i"},
		{name: "post-204", method: "POST", path: "/204", body: "n"},
		{name: "post-upgrade", method: "POST", path: "/upgrade", body: "up", upgrade: true,
			header: map[string][]string{"Upgrade": {"echo"}, "Connection": {"Upgrade"}}},
		{name: "post-cancel-mid-body", method: "POST", path: "/stall", body: "c", cancel: true},
		{name: "post-close", method: "POST", path: "/echo", body: "c", close: true},
		{name: "post-close-delimited", raw: true, method: "POST", path: "/close-delimited", body: "x"},
		{name: "post-http10", raw: true, method: "POST", path: "/http10", body: "x"},
		{name: "post-extra-bytes", raw: true, method: "POST", path: "/extra-bytes", body: "x"},
		{name: "post-after-extra", raw: true, method: "POST", path: "/reason", body: "x"},
		{name: "post-cl-close", raw: true, method: "POST", path: "/cl-close", body: "x"},
		{name: "post-100-unsolicited", raw: true, method: "POST", path: "/100-then-200", body: "x"},
		{name: "post-garbage", raw: true, method: "POST", path: "/garbage", body: "x", errKind: ErrBadResponse},
		{name: "post-huge-header", raw: true, method: "POST", path: "/huge-header", body: "x", errKind: ErrHeaderTooLarge},
		{name: "post-truncated", raw: true, method: "POST", path: "/truncated", body: "x", errKind: ErrConnBroken},
	}
	for i := range cases {
		tc := cases[i]
		t.Run(tc.name, func(t *testing.T) {
			want, wantErr := run(t, &tc, serverBodies{referenceTransport(t)}, baseOf(u))
			if (tc.errKind == nil) != (wantErr == nil) {
				t.Fatalf("net/http: %v", wantErr)
			}
			check := func(path string, rt http.RoundTripper) {
				got, err := run(t, &tc, rt, baseOf(u))
				if tc.errKind != nil {
					if err == nil || !errors.Is(err, tc.errKind) || IsRetrySafe(err) {
						t.Errorf("%s: error %v; want a %v, not retry-safe", path, err, tc.errKind)
					}
				} else if err != nil {
					t.Fatalf("%s: %v", path, err)
				}
				if !reflect.DeepEqual(want, got) {
					t.Errorf("%s differs from net/http:\n want %+v\n  got %+v", path, want, got)
				}
			}
			check("local", local)
			warmPath, base := "/cl", u.srv.URL
			if tc.raw {
				warmPath, base = "/reason", "http://"+u.raw.Addr().String()
			}
			warm(t, owner, base+warmPath)
			before := client.node.Stats().ReusedRemote
			check("remote", remote)
			if got := client.node.Stats().ReusedRemote; got != before+1 {
				t.Errorf("remote path: ReusedRemote went %d -> %d, want one remote use", before, got)
			}
		})
	}
}

// TestAdv2H2CShortBodyServerHanded: a unary call whose short body a server
// hands on (read ahead, whole), on an h2c upstream: the owner's own
// request (useH2/createH2 read the trackBody itself) and a sibling's (the
// body goes with its head to the owner, which sends it on its h2
// connection). The upstream gets the message and the declared length, and
// Response.Request is the caller's.
func TestAdv2H2CShortBodyServerHanded(t *testing.T) {
	up := newH2Upstream(t, 100)
	owner, client := remotePair(t, h2cConf)
	msg := grpcmsg.Frame([]byte("hello"))
	for i, m := range []*member{owner, client, owner, client} {
		src := &splitReader{parts: []string{string(msg)}, eofLast: i%2 == 1}
		req := grpcReq(t, context.Background(), up.url+"/unary", src)
		req.ContentLength = int64(len(msg))
		resp, err := m.tr.RoundTrip(req)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		p, err := grpcmsg.Read(resp.Body)
		drain(resp)
		if err != nil || string(p) != "hello" || resp.Trailer.Get("Grpc-Status") != "0" {
			t.Fatalf("request %d: message %q, %v, trailer %v", i, p, err, resp.Trailer)
		}
		if resp.Request != req {
			t.Fatalf("request %d: Response.Request is not the caller's", i)
		}
		if c := src.closed.Load(); c != 1 {
			t.Fatalf("request %d: body closed %d times", i, c)
		}
	}
	if s := client.node.Stats(); s.ReusedRemote != 2 {
		t.Fatalf("client stats %+v: want 2 remote uses", s)
	}
}

// TestAdv2DeadlineWhileReadingAheadLikeNetHTTP: the request's deadline
// passes while the client has sent none of its short body, to an upstream
// that reads the body before it answers: net/http waits for its writer
// (stuck in the body's Read) before it returns, and so does the
// read-ahead; both then fail with the deadline, in about the same time.
// (An upstream that answers on the head alone is where they differ, as
// documented: net/http returns its answer, the read-ahead waits.)
func TestAdv2DeadlineWhileReadingAheadLikeNetHTTP(t *testing.T) {
	u := newTestUpstream(t)
	for _, tc := range []struct {
		name string
		rt   http.RoundTripper
	}{
		{"net-http", &http.Transport{}},
		{"local", localTransport(t, nil)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := newGatedBody("hello")
			timer := time.AfterFunc(300*time.Millisecond, body.open)
			defer timer.Stop()
			ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, "POST", u.url("/echo"), body)
			req.ContentLength = 5
			start := time.Now()
			resp, err := tc.rt.RoundTrip(req)
			if err == nil {
				resp.Body.Close()
				t.Fatal("a request past its deadline succeeded")
			}
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("error %v is not the deadline", err)
			}
			if d := time.Since(start); d > 2*time.Second {
				t.Fatalf("returned after %v", d)
			}
			t.Logf("%s: %v after %v", tc.name, err, time.Since(start).Round(time.Millisecond))
		})
	}
}

// TestShutdownTimeoutRefusesWaitingRequest: a sibling's POST waits on the
// owner for a worker (the owner's one worker is busy) when the owner's
// Shutdown times out. Nothing of it has gone upstream, so the closing owner
// refuses it: the sibling sends it on a plan of its own, and the upstream
// sees it once.
func TestShutdownTimeoutRefusesWaitingRequest(t *testing.T) {
	u := newHangUpstream(t)
	close(u.release)
	gov := governor.New(1, 0)
	owner, client := budgetFleet(t, NodeOptions{Governor: gov, MaxLeaseWait: time.Second},
		// A cap of the owner's one connection: a POST dials its own
		// connection while the cap allows.
		func(tr *Transport) { tr.MaxConnsPerKey = 1 })
	warm(t, owner, u.srv.URL+"/warm")
	held := gov.Acquire()
	defer held.Release()

	req, _ := http.NewRequest("POST", u.srv.URL+"/hang", io.NopCloser(strings.NewReader("once")))
	req.ContentLength = 4
	done := sendAsync(client.tr, req)
	waitFor(t, 2*time.Second, "the POST to wait on the owner", func() bool { return client.node.Stats().ReusedRemote == 1 })
	time.Sleep(50 * time.Millisecond)
	sctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	owner.node.Shutdown(sctx)
	cancel()
	select {
	case r := <-done:
		if r.err != nil || r.body != "ok" {
			t.Fatalf("a POST refused by a closing owner before it reached the upstream: %q, %v", r.body, r.err)
		}
	case <-time.After(8 * time.Second):
		t.Fatal("the POST hung")
	}
	held.Release()
	time.Sleep(100 * time.Millisecond)
	if n := u.count("POST once"); n != 1 {
		t.Fatalf("the upstream saw the POST %d times", n)
	}
}
