package proxy

import (
	"context"
	"io"
	"net/http"
	"net/http/httptrace"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestAdv55H2Got100ContinueCount: a caller whose trace has Got100Continue
// but no Got1xxResponse (flagNoInterim) sends a request to an HTTP/2
// upstream that answers 100, 100, then 200. x/net/http2 reports every 100
// it reads through Got100Continue, whether or not the request said Expect
// (traceGot100Continue is unconditional), and so does orbit's local path.
// Through a sibling the owner relays each 100 (relay100), but the caller's
// reader fires Got100Continue only for the first one, and only if the
// request sent Expect: 100-continue.
func TestAdv55H2Got100ContinueCount(t *testing.T) {
	up := newRawH2(t, func(s *rawStream) {
		if s.path == "/" {
			s.headers(false, ":status", "200", "content-length", "2")
			s.data(true, []byte("ok"))
			return
		}
		s.headers(false, ":status", "100")
		s.headers(false, ":status", "100")
		s.headers(false, ":status", "200", "content-length", "2")
		s.data(true, []byte("ok"))
	})
	owner, client := remotePair(t, func(tr *Transport) { h2cConf(tr); tr.ExpectContinueTimeout = 3 * time.Second })
	if err := getOK(owner, context.Background(), up.url+"/"); err != nil {
		t.Fatal(err)
	}
	ref := refH2C()
	defer ref.CloseIdleConnections()
	type shape struct {
		name, method, path string
		expect             bool
	}
	for _, sh := range []shape{{"GET without Expect", "GET", "/get", false}, {"POST with Expect", "POST", "/early/post", true}} {
		counts := map[string]int64{}
		outs := map[string]h2Outcome{}
		for _, name := range h2Paths {
			rt := map[string]http.RoundTripper{"x/net": ref, "owner": owner.tr, "sibling": client.tr}[name]
			var n atomic.Int64
			trace := &httptrace.ClientTrace{Got100Continue: func() { n.Add(1) }}
			ctx, cancel := context.WithTimeout(httptrace.WithClientTrace(context.Background(), trace), 5*time.Second)
			var body io.Reader
			if sh.method == "POST" {
				body = io.NopCloser(strings.NewReader("hello"))
			}
			req, _ := http.NewRequestWithContext(ctx, sh.method, up.url+sh.path, body)
			if sh.expect {
				req.ContentLength = 5
				req.Header.Set("Expect", "100-continue")
			}
			outs[name] = roundTripOutcome(rt, req)
			cancel()
			counts[name] = n.Load()
		}
		if outs["x/net"].status != 200 || counts["x/net"] != 2 || counts["owner"] != counts["x/net"] {
			t.Fatalf("%s: reference changed: x/net %+v (%d), local %+v (%d)", sh.name, outs["x/net"], counts["x/net"], outs["owner"], counts["owner"])
		}
		if g := outs["sibling"]; g.status != 200 || g.err != "" || counts["sibling"] != counts["x/net"] {
			t.Errorf("%s, upstream 100, 100, 200: the sibling's Got100Continue fired %d times (status %d error %q); x/net/http2 and the local path: %d",
				sh.name, counts["sibling"], g.status, g.err, counts["x/net"])
		}
	}
	if s := client.node.Stats(); s.ReusedRemote == 0 {
		t.Errorf("the sibling's request did not go through the owner: %+v", s)
	}
}
