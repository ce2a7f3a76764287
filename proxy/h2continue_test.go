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

// TestH2ExpectContinueWithoutInterimHook: a caller that reads no interim
// responses (no Got1xxResponse) and sends Expect: 100-continue through a
// sibling to an HTTP/2 upstream still gets the upstream's 100, so its body
// goes at once and not after ExpectContinueTimeout: the owner's HTTP/2
// client reports it through Got100Continue, the owner's only interim hook
// for such a caller.
func TestH2ExpectContinueWithoutInterimHook(t *testing.T) {
	up := newH2CServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Method != "POST" {
			io.WriteString(w, "ok")
			return
		}
		b, _ := io.ReadAll(r.Body)
		io.WriteString(w, "got "+string(b))
	})
	owner, client := remotePair(t, func(tr *Transport) {
		tr.H2C = true
		tr.ExpectContinueTimeout = 3 * time.Second
	})
	if err := getOK(owner, context.Background(), up.url+"/"); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"owner", "sibling"} {
		rt := map[string]http.RoundTripper{"owner": owner.tr, "sibling": client.tr}[name]
		var got100 atomic.Bool
		trace := &httptrace.ClientTrace{Got100Continue: func() { got100.Store(true) }}
		ctx, cancel := context.WithTimeout(httptrace.WithClientTrace(context.Background(), trace), 5*time.Second)
		body := strings.Repeat("c", 8<<10)
		req, _ := http.NewRequestWithContext(ctx, "POST", up.url+"/continue", io.NopCloser(strings.NewReader(body)))
		req.ContentLength = int64(len(body))
		req.Header.Set("Expect", "100-continue")
		o := roundTripOutcome(rt, req)
		cancel()
		if o.err != "" || o.status != 200 || o.body != "got "+body || o.duration > 2*time.Second || !got100.Load() {
			t.Errorf("%s: Expect: 100-continue without a 1xx hook: status %d error %q after %v, body of %d bytes, Got100Continue %v; want the body echoed at once after the 100",
				name, o.status, o.err, o.duration, len(o.body), got100.Load())
		}
	}
	if s := client.node.Stats(); s.Created != 0 || s.ReusedRemote != 1 {
		t.Errorf("sibling %+v: want its request through the owner", s)
	}
}
