package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"reflect"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// diffCase is one upstream behaviour, requested through net/http.Transport
// and through this package's Transport on the local and the remote path.
type diffCase struct {
	name    string
	method  string
	raw     bool   // the scripted raw upstream
	path    string // may carry a query
	body    string
	chunked bool        // send body with unknown length
	trailer http.Header // request trailers
	header  map[string][]string
	close   bool
	stream  bool // read the three gated chunks one by one
	upgrade bool
	cancel  bool // cancel the context after the first body byte
	errKind error
}

var diffCases = []diffCase{
	{name: "content-length", path: "/cl"},
	{name: "gzip-transparent", path: "/gzip"},
	{name: "gzip-caller-asked", path: "/gzip", header: map[string][]string{"Accept-Encoding": {"gzip"}}},
	{name: "gzip-head", method: "HEAD", path: "/gzip"},
	{name: "gzip-range", path: "/gzip", header: map[string][]string{"Range": {"bytes=0-"}}},
	{name: "empty", path: "/empty"},
	{name: "chunked", path: "/chunked"},
	{name: "trailers", path: "/trailers"},
	{name: "head", method: "HEAD", path: "/head"},
	{name: "get-head-path", path: "/head"},
	{name: "204", path: "/204"},
	{name: "304", path: "/304", header: map[string][]string{"If-None-Match": {`"v1"`}}},
	{name: "1xx", path: "/1xx"},
	{name: "echo-get", path: "/echo?q=1&r=%20x"},
	{name: "echo-ua-absent", path: "/echo", header: map[string][]string{"X-A": {"1", "2"}}},
	{name: "echo-ua-empty", path: "/echo", header: map[string][]string{"User-Agent": {""}}},
	{name: "echo-ua-custom", path: "/echo", header: map[string][]string{"User-Agent": {"tester/1"}}},
	{name: "post-content-length", method: "POST", path: "/echo", body: "a=1&b=2"},
	{name: "post-chunked-trailers", method: "POST", path: "/echo", body: "streamed body", chunked: true,
		trailer: http.Header{"X-Req-Trailer": {"tv"}}},
	{name: "expect-continue", method: "PUT", path: "/echo", body: "continue body",
		header: map[string][]string{"Expect": {"100-continue"}}},
	{name: "expect-continue-chunked", method: "PUT", path: "/echo", body: "continue body", chunked: true,
		header: map[string][]string{"Expect": {"100-continue"}}},
	{name: "expect-rejected", method: "PUT", path: "/expect-reject", body: strings.Repeat("z", 1<<16),
		header: map[string][]string{"Expect": {"100-continue"}}},
	{name: "request-close", path: "/echo", close: true},
	{name: "stream", path: "/stream", stream: true},
	{name: "big-chunked", path: "/big?n=1048576"},
	{name: "big-content-length", path: "/big?n=1048576&cl=1"},
	{name: "upgrade", path: "/upgrade", upgrade: true, header: map[string][]string{"Upgrade": {"echo"}, "Connection": {"Upgrade"}}},
	{name: "cancel-mid-body", path: "/stall", cancel: true},
	{name: "close-delimited", raw: true, path: "/close-delimited"},
	{name: "http10", raw: true, path: "/http10"},
	{name: "http10-eof", raw: true, path: "/http10-eof"},
	{name: "extra-bytes", raw: true, path: "/extra-bytes"},
	// Right after extra-bytes: its own response, not the one left over.
	{name: "reason-phrase", raw: true, path: "/reason"},
	{name: "cl-close", raw: true, path: "/cl-close"},
	{name: "no-reason", raw: true, path: "/no-reason"},
	{name: "trailing-space", raw: true, path: "/trailing-space"},
	{name: "100-unsolicited", raw: true, path: "/100-then-200"},
	{name: "head-chunked", raw: true, method: "HEAD", path: "/head-chunked"},
	{name: "malformed", raw: true, path: "/malformed", errKind: ErrBadResponse},
	{name: "garbage", raw: true, path: "/garbage", errKind: ErrBadResponse},
	{name: "huge-header", raw: true, path: "/huge-header", errKind: ErrHeaderTooLarge},
	{name: "truncated", raw: true, path: "/truncated", errKind: ErrConnBroken},
	{name: "truncated-chunked", raw: true, path: "/truncated-chunked", errKind: ErrConnBroken},
	// A short body goes with its head, and the owner tells the failure in
	// an error frame, as it does for a request without a body.
	{name: "post-malformed", raw: true, method: "POST", path: "/malformed", body: "a=1", errKind: ErrBadResponse},
}

// diffSanity checks that the reference run shows the behaviour a case is
// about, so that agreeing on nothing cannot pass.
var diffSanity = map[string]func(o observation) bool{
	"content-length": func(o observation) bool { return o.ContentLength == 11 && o.Body == "hello world" },
	"chunked":        func(o observation) bool { return o.ContentLength == -1 && len(o.TE) == 1 },
	"trailers": func(o observation) bool {
		return o.Trailer.Get("X-Sum") == "42" && o.Trailer.Get("X-Late") == "undeclared"
	},
	"head":                  func(o observation) bool { return o.ContentLength == 1234 && o.Body == "" },
	"1xx":                   func(o observation) bool { return len(o.Interim) == 2 && strings.Contains(o.Interim[1], "b.js") },
	"echo-ua-absent":        func(o observation) bool { return strings.Contains(o.Body, "Go-http-client") },
	"gzip-transparent":      func(o observation) bool { return o.Uncompressed && o.Body == "compressed hello, compressed hello" },
	"gzip-caller-asked":     func(o observation) bool { return !o.Uncompressed && o.Header.Get("Content-Encoding") == "gzip" },
	"echo-ua-empty":         func(o observation) bool { return !strings.Contains(o.Body, "User-Agent") },
	"post-chunked-trailers": func(o observation) bool { return strings.Contains(o.Body, `trailer X-Req-Trailer: ["tv"]`) },
	"expect-continue":       func(o observation) bool { return o.Got100 && strings.Contains(o.Body, "continue body") },
	"expect-rejected":       func(o observation) bool { return !o.Got100 && o.StatusCode == 417 },
	"stream":                func(o observation) bool { return len(o.Chunks) == 3 },
	"upgrade":               func(o observation) bool { return o.StatusCode == 101 && o.Body == "ping|bye" },
	"close-delimited":       func(o observation) bool { return o.Close && o.ContentLength == -1 && len(o.TE) == 0 },
	"http10":                func(o observation) bool { return o.Proto == "HTTP/1.0" },
	"reason-phrase":         func(o observation) bool { return o.Status == "299 Quite Fine Indeed" },
	"100-unsolicited":       func(o observation) bool { return len(o.Interim) == 1 && o.Body == "done" },
	"big-chunked":           func(o observation) bool { return strings.HasPrefix(o.Body, "1048576 bytes") },
}

// observation is everything a caller can see of an exchange.
type observation struct {
	RoundTripErr  bool
	BodyErr       bool
	Status        string
	StatusCode    int
	Proto         string
	Header        http.Header
	ContentLength int64
	TE            []string
	Close         bool
	Uncompressed  bool
	Body          string
	Trailer       http.Header
	Interim       []string
	Got100        bool
	Chunks        []string
}

var streamSeq atomic.Int64

func (tc *diffCase) request(ctx context.Context, base string) *http.Request {
	method := tc.method
	if method == "" {
		method = "GET"
	}
	path := tc.path
	if tc.stream {
		path += fmt.Sprintf("?id=%d", streamSeq.Add(1))
	}
	var body io.Reader
	if tc.body != "" {
		body = strings.NewReader(tc.body)
		if tc.chunked {
			body = io.MultiReader(strings.NewReader(tc.body[:len(tc.body)/2]), strings.NewReader(tc.body[len(tc.body)/2:]))
		}
	}
	req, err := http.NewRequestWithContext(ctx, method, base+path, body)
	if err != nil {
		panic(err)
	}
	if tc.chunked {
		req.ContentLength = -1
		req.GetBody = nil
	}
	for k, v := range tc.header {
		req.Header[k] = v
	}
	if tc.trailer != nil {
		req.Trailer = tc.trailer.Clone()
	}
	req.Close = tc.close
	return req
}

// fataler is what run needs of its test: a child process that runs a case
// for TestMultiProcessDifferential has no *testing.T.
type fataler interface {
	Helper()
	Fatalf(format string, args ...any)
}

// diffBase says where a case's upstreams are.
type diffBase struct {
	srv, raw string                        // base URLs of the net/http and the raw upstream
	gate     func(id string) chan struct{} // the stream handler's gates; nil away from the upstream's process
}

func baseOf(u *testUpstream) diffBase {
	return diffBase{srv: u.srv.URL, raw: "http://" + u.raw.Addr().String(), gate: u.gate}
}

func run(t fataler, tc *diffCase, rt http.RoundTripper, u diffBase) (observation, error) {
	t.Helper()
	var o observation
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	trace := &httptrace.ClientTrace{
		Got1xxResponse: func(code int, h textproto.MIMEHeader) error {
			o.Interim = append(o.Interim, fmt.Sprintf("%d %v", code, fmtHeader(http.Header(h))))
			return nil
		},
		Got100Continue: func() { o.Got100 = true },
	}
	ctx = httptrace.WithClientTrace(ctx, trace)
	base := u.srv
	if tc.raw {
		base = u.raw
	}
	req := tc.request(ctx, base)
	resp, err := rt.RoundTrip(req)
	if err != nil {
		o.RoundTripErr = true
		return o, err
	}
	defer resp.Body.Close()
	o.Status, o.StatusCode, o.Proto = resp.Status, resp.StatusCode, resp.Proto
	o.Header = resp.Header
	o.ContentLength, o.TE, o.Close, o.Uncompressed = resp.ContentLength, resp.TransferEncoding, resp.Close, resp.Uncompressed
	switch {
	case tc.upgrade:
		rw, ok := resp.Body.(io.ReadWriteCloser)
		if !ok {
			t.Fatalf("101 body %T is not an io.ReadWriteCloser", resp.Body)
		}
		cw, ok := resp.Body.(interface{ CloseWrite() error })
		if !ok {
			t.Fatalf("101 body %T has no CloseWrite", resp.Body)
		}
		io.WriteString(rw, "ping")
		if err := cw.CloseWrite(); err != nil {
			t.Fatalf("CloseWrite: %v", err)
		}
		b, err := io.ReadAll(rw)
		o.Body = string(b)
		if err != nil {
			o.BodyErr = true
			return o, err
		}
	case tc.stream:
		id := req.URL.Query().Get("id")
		for i := range 3 {
			want := fmt.Sprintf("chunk-%d;", i)
			got, err := readWithTimeout(resp.Body, len(want), 3*time.Second)
			if err != nil {
				t.Fatalf("chunk %d did not arrive on its own: %v (got %q)", i, err, got)
			}
			o.Chunks = append(o.Chunks, got)
			u.gate(id) <- struct{}{}
		}
		rest, err := io.ReadAll(resp.Body)
		o.Body = string(rest)
		if err != nil {
			o.BodyErr = true
			return o, err
		}
	case tc.cancel:
		cancel()
		_, err := io.ReadAll(resp.Body)
		if err == nil {
			t.Fatalf("body read after cancel succeeded")
		}
		o.BodyErr = true
		if !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
			return o, fmt.Errorf("body error after cancel is not a context error: %w", err)
		}
		return o, nil
	default:
		b, err := io.ReadAll(resp.Body)
		o.Body = string(b)
		if len(o.Body) > 4096 {
			o.Body = fmt.Sprintf("%d bytes, sum %d", len(b), checksum(b))
		}
		if err != nil {
			o.BodyErr = true
			return o, err
		}
	}
	o.Trailer = resp.Trailer
	return o, nil
}

func checksum(b []byte) uint64 {
	var s uint64
	for i, c := range b {
		s = s*31 + uint64(c) + uint64(i)
	}
	return s
}

func fmtHeader(h http.Header) string {
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%s=%q;", k, h[k])
	}
	return b.String()
}

// readWithTimeout reads exactly n bytes, failing if they take longer than d:
// a transport that batches a stream would hold the chunk back.
func readWithTimeout(r io.Reader, n int, d time.Duration) (string, error) {
	type res struct {
		b   []byte
		err error
	}
	ch := make(chan res, 1)
	go func() {
		b := make([]byte, n)
		_, err := io.ReadFull(r, b)
		ch <- res{b, err}
	}()
	select {
	case r := <-ch:
		return string(r.b), r.err
	case <-time.After(d):
		return "", errors.New("timeout")
	}
}

// referenceTransport is a net/http.Transport for one case's reference
// run. Each case has its own: net/http's pool can give the next request a
// connection the upstream sent an unasked response on (extra-bytes) before
// its read loop has seen those bytes, and the reference would then show the
// leftover instead of the case's own behaviour.
func referenceTransport(t *testing.T) *http.Transport {
	rt := &http.Transport{
		MaxResponseHeaderBytes: 16 << 10,
		ExpectContinueTimeout:  time.Second,
	}
	t.Cleanup(rt.CloseIdleConnections)
	return rt
}

func configure(tr *Transport) { tr.MaxResponseHeaderBytes = 16 << 10 }

// TestDifferential runs every behaviour through net/http.Transport and
// through Transport, locally and through an owner process, and requires the
// caller to see the same thing.
func TestDifferential(t *testing.T) {
	u := newTestUpstream(t)
	local := localTransport(t, configure)
	owner, client := remotePair(t, configure)

	for i := range diffCases {
		tc := diffCases[i]
		t.Run(tc.name, func(t *testing.T) {
			want, wantErr := run(t, &tc, referenceTransport(t), baseOf(u))
			if tc.errKind == nil && wantErr != nil {
				t.Fatalf("net/http: %v", wantErr)
			}
			if tc.errKind != nil && wantErr == nil {
				t.Fatalf("net/http: no error for %s", tc.name)
			}
			if sanity, ok := diffSanity[tc.name]; ok && !sanity(want) {
				t.Fatalf("net/http observation does not show the behaviour under test: %+v", want)
			}
			check := func(path string, rt http.RoundTripper) {
				got, err := run(t, &tc, rt, baseOf(u))
				if tc.errKind != nil {
					if err == nil {
						t.Fatalf("%s: no error", path)
					}
					if !errors.Is(err, tc.errKind) {
						t.Errorf("%s: error %v is not %v", path, err, tc.errKind)
					}
					if IsRetrySafe(err) {
						t.Errorf("%s: error %v claims retry safety after the request was sent", path, err)
					}
				} else if err != nil {
					t.Fatalf("%s: %v", path, err)
				}
				if !reflect.DeepEqual(want, got) {
					t.Errorf("%s differs from net/http:\n want %+v\n  got %+v", path, want, got)
				}
			}
			check("local", local)

			warmPath := "/cl"
			base := u.srv.URL
			if tc.raw {
				warmPath, base = "/reason", "http://"+u.raw.Addr().String()
			}
			warm(t, owner, base+warmPath)
			before := client.node.Stats().ReusedRemote
			check("remote", client.tr)
			if got := client.node.Stats().ReusedRemote; got != before+1 {
				t.Errorf("remote path: ReusedRemote went %d -> %d, want one remote use", before, got)
			}
		})
	}
}
