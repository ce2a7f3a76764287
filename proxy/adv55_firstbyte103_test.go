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

	"golang.org/x/net/http2"
)

// TestAdv55H2FirstByteOn103ThenReset: a caller that reads no interim
// responses (no Got1xxResponse) but traces GotFirstResponseByte; the HTTP/2
// upstream answers a 103 and then resets the stream. x/net/http2 fires
// GotFirstResponseByte on the 103's HEADERS (processHeaders, cs.firstByte),
// and orbit's local path does too. Through a sibling the owner does not
// relay the 103 (continueOnly), so the owner's error frame is the first
// thing the sibling reads: in the preamble for a GET (nothing accepted), in
// place of the first head for a POST whose body the owner read: it must
// say that a response had begun (flagResponseBegan) for the sibling to fire
// GotFirstResponseByte.
func TestAdv55H2FirstByteOn103ThenReset(t *testing.T) {
	up := newRawH2(t, func(s *rawStream) {
		if s.path == "/" {
			s.headers(false, ":status", "200", "content-length", "2")
			s.data(true, []byte("ok"))
			return
		}
		s.headers(false, ":status", "103", "link", "</a.css>; rel=preload")
		time.Sleep(20 * time.Millisecond)
		s.rst(http2.ErrCodeInternal)
	})
	owner, client := remotePair(t, h2cConf)
	if err := getOK(owner, context.Background(), up.url+"/"); err != nil {
		t.Fatal(err)
	}
	ref := refH2C()
	defer ref.CloseIdleConnections()
	for _, method := range []string{"GET", "POST"} {
		counts := map[string]int64{}
		outs := map[string]h2Outcome{}
		for _, name := range h2Paths {
			rt := map[string]http.RoundTripper{"x/net": ref, "owner": owner.tr, "sibling": client.tr}[name]
			var n atomic.Int64
			trace := &httptrace.ClientTrace{GotFirstResponseByte: func() { n.Add(1) }}
			ctx, cancel := context.WithTimeout(httptrace.WithClientTrace(context.Background(), trace), 5*time.Second)
			var body io.Reader
			if method == "POST" {
				body = strings.NewReader("hello")
			}
			req, _ := http.NewRequestWithContext(ctx, method, up.url+"/x", body)
			outs[name] = roundTripOutcome(rt, req)
			cancel()
			counts[name] = n.Load()
		}
		if outs["x/net"].err == "" || counts["x/net"] != 1 || counts["owner"] != 1 || outs["owner"].err == "" {
			t.Fatalf("%s: reference changed: x/net %+v (%d), local %+v (%d)", method, outs["x/net"], counts["x/net"], outs["owner"], counts["owner"])
		}
		if g := outs["sibling"]; g.err == "" || counts["sibling"] != 1 {
			t.Errorf("%s, upstream 103 then RST_STREAM: the sibling's GotFirstResponseByte fired %d times (error %q); x/net/http2 and the local path: once (error %q)",
				method, counts["sibling"], g.err, outs["x/net"].err)
		}
	}
	if s := client.node.Stats(); s.ReusedRemote == 0 {
		t.Errorf("the sibling's request did not go through the owner: %+v", s)
	}
}
