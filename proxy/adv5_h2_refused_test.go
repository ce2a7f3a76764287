package proxy

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/internal/grpcmsg"
	"golang.org/x/net/http2"
)

// TestAdv5H2RefusedAndGoAwayRetried: a stream the upstream refuses
// (RST_STREAM REFUSED_STREAM) or leaves out of a GOAWAY (its ID above the
// last one processed) reached nothing upstream, and x/net/http2's own
// Transport sends it again. Locally and through a sibling, with a short
// body and without one, the request succeeds; through the sibling, the
// sibling's request is retried, not failed.
func TestAdv5H2RefusedAndGoAwayRetried(t *testing.T) {
	var mu sync.Mutex
	tricked := map[string]bool{} // path + member: the first stream was refused
	var refusedN, goAwayN atomic.Int64
	up := newRawH2(t, func(s *rawStream) {
		mu.Lock()
		first := !tricked[s.path]
		tricked[s.path] = true
		mu.Unlock()
		switch {
		case first && len(s.path) > 7 && s.path[:8] == "/refused":
			refusedN.Add(1)
			s.rst(http2.ErrCodeRefusedStream)
			return
		case first && len(s.path) > 6 && s.path[:7] == "/goaway":
			goAwayN.Add(1)
			s.goAway(s.id - 2)
			return
		}
		s.headers(false, ":status", "200", "content-type", "application/grpc")
		s.data(true, []byte("ok"))
	})
	owner, client := h2Pair(t, up.url)
	n := 0
	for _, kind := range []string{"/refused", "/goaway"} {
		for _, m := range []*member{owner, client} {
			for _, withBody := range []bool{false, true} {
				n++
				path := kind + "/" + map[bool]string{true: "owner", false: "sibling"}[m == owner] + map[bool]string{true: "/body", false: ""}[withBody]
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				var body io.Reader = http.NoBody
				if withBody {
					body = bytes.NewReader(grpcmsg.Frame([]byte("payload")))
				}
				req := grpcReq(t, ctx, up.url+path, body)
				o := roundTripOutcome(m.tr, req)
				cancel()
				if o.err != "" || o.status != 200 || o.body != "ok" {
					t.Errorf("%s: %+v; want it sent again and answered", path, o)
				}
			}
		}
	}
	if refusedN.Load() != 4 || goAwayN.Load() != 4 {
		t.Errorf("the upstream refused %d and went away under %d streams, want 4 and 4", refusedN.Load(), goAwayN.Load())
	}
	capacityBack(t, owner, up.url)
}
