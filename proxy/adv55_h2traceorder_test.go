package proxy

import (
	"context"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestAdv55H2Interim100TraceOrder: a caller that traces both
// Got1xxResponse and Got100Continue sends Expect: 100-continue to an
// HTTP/2 upstream that answers 100, then 200. x/net/http2 calls
// Got1xxResponse(100) and then Got100Continue (handleResponse: the 1xx
// hook, then traceGot100Continue), and so does orbit's local path. Through
// a sibling the caller's reader follows net/http's HTTP/1.1 order
// (Got100Continue first), though the upstream spoke HTTP/2.
func TestAdv55H2Interim100TraceOrder(t *testing.T) {
	up := newRawH2(t, func(s *rawStream) {
		if s.path == "/" {
			s.headers(false, ":status", "200", "content-length", "2")
			s.data(true, []byte("ok"))
			return
		}
		s.headers(false, ":status", "100")
		time.Sleep(10 * time.Millisecond)
		s.headers(false, ":status", "200", "content-length", "2")
		s.data(true, []byte("ok"))
	})
	owner, client := remotePair(t, func(tr *Transport) { h2cConf(tr); tr.ExpectContinueTimeout = 3 * time.Second })
	if err := getOK(owner, context.Background(), up.url+"/"); err != nil {
		t.Fatal(err)
	}
	ref := refH2C()
	defer ref.CloseIdleConnections()
	seqs := map[string]string{}
	outs := map[string]h2Outcome{}
	for _, name := range h2Paths {
		rt := map[string]http.RoundTripper{"x/net": ref, "owner": owner.tr, "sibling": client.tr}[name]
		var mu sync.Mutex
		var seq []string
		trace := &httptrace.ClientTrace{
			Got1xxResponse: func(code int, h textproto.MIMEHeader) error {
				mu.Lock()
				seq = append(seq, "1xx:"+strconv.Itoa(code))
				mu.Unlock()
				return nil
			},
			Got100Continue: func() {
				mu.Lock()
				seq = append(seq, "100continue")
				mu.Unlock()
			},
		}
		ctx, cancel := context.WithTimeout(httptrace.WithClientTrace(context.Background(), trace), 5*time.Second)
		req, _ := http.NewRequestWithContext(ctx, "POST", up.url+"/early/x", strings.NewReader(strings.Repeat("p", 256<<10)))
		req.Header.Set("Expect", "100-continue")
		outs[name] = roundTripOutcome(rt, req)
		cancel()
		mu.Lock()
		seqs[name] = strings.Join(seq, ",")
		mu.Unlock()
	}
	const want = "1xx:100,100continue"
	if outs["x/net"].status != 200 || seqs["x/net"] != want || seqs["owner"] != want {
		t.Fatalf("reference changed: x/net %q %+v; local %q %+v", seqs["x/net"], outs["x/net"], seqs["owner"], outs["owner"])
	}
	if g := outs["sibling"]; g.status != 200 || seqs["sibling"] != want {
		t.Errorf("HTTP/2 upstream, 100 then 200: the sibling's trace saw %q (status %d error %q); x/net/http2 and the local path: %q",
			seqs["sibling"], g.status, g.err, want)
	}
	if s := client.node.Stats(); s.ReusedRemote == 0 {
		t.Errorf("the sibling's request did not go through the owner: %+v", s)
	}
}
