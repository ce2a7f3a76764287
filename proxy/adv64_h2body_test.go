package proxy

import (
	"context"
	"crypto/tls"
	"io"
	"net/http"
	"testing"
	"time"

	"golang.org/x/net/http2"
)

// An upstream over HTTP/2 resets a stream after it read the first part of
// a body whose caller sends the rest only once it has the response (a
// two-way stream). x/net's client closes the caller's body when the stream
// fails, so RoundTrip returns at once with the stream's error; so must the
// owner's path, and a sibling whatever its own connections made it take the
// upstream for (spokeH1: HTTP/2, or HTTP/1.1 by ALPN): the owner's accept
// (flagAcceptH2) says the exchange runs on HTTP/2, and the failed exchange
// closes the body (remote.go sets stopBody), rather than wait in it until
// the caller gives up on its body, past its own deadline (1s here).
func TestAdv64H2AcceptFailedStreamHoldsBody(t *testing.T) {
	ts, roots, owner, client, e := h2TLSPair(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Method != "POST" {
			io.WriteString(w, "ok")
			return
		}
		b := make([]byte, 5)
		io.ReadFull(r.Body, b)
		panic(http.ErrAbortHandler) // RST_STREAM
	}, func(tr *Transport) { tr.MaxRetries = -1 })
	ref := &http2.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}
	defer ref.CloseIdleConnections()

	const hold = 4 * time.Second
	took := map[string]time.Duration{}
	for _, p := range []struct {
		name string
		rt   http.RoundTripper
	}{{"x/net", ref}, {"owner", owner.tr}, {"sibling", client.tr}, {"sibling guessing h2", client.tr}} {
		e.spokeH1.Store(p.name == "sibling")
		pr, pw := io.Pipe()
		go func() {
			pw.Write([]byte("part1"))
			// The rest would come once the caller has the response.
		}()
		stop := time.AfterFunc(hold, func() { pw.CloseWithError(io.ErrUnexpectedEOF) })
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		req, _ := http.NewRequestWithContext(ctx, "POST", ts.URL+"/upload", pr)
		start := time.Now()
		resp, err := p.rt.RoundTrip(req)
		took[p.name] = time.Since(start)
		if resp != nil {
			resp.Body.Close()
			t.Errorf("%s: status %d; want the stream's reset", p.name, resp.StatusCode)
		}
		stop.Stop()
		pw.CloseWithError(io.ErrUnexpectedEOF)
		cancel()
		t.Logf("%s: error %v after %v", p.name, err, took[p.name].Round(time.Millisecond))
	}
	if s := client.node.Stats(); s.ReusedRemote == 0 {
		t.Fatalf("the sibling's request did not go through the owner: %+v", s)
	}
	if took["x/net"] < hold/2 && took["sibling"] >= hold/2 {
		t.Errorf("RoundTrip returned after x/net %v, owner %v, sibling guessing h2 %v, sibling guessing h1.1 %v; want the sibling, whose owner's accept said HTTP/2, to return as x/net does once the stream fails, not when the caller's body ends (4s), past the request's 1s deadline",
			took["x/net"].Round(time.Millisecond), took["owner"].Round(time.Millisecond), took["sibling guessing h2"].Round(time.Millisecond), took["sibling"].Round(time.Millisecond))
	}
}
