package proxy

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestAdv47KnownLengthTrailersReadByOwner: a request of known length with
// trailers crosses the unix leg chunked, its length in the frame
// (flagLength). serveOne restores the length and clears TransferEncoding
// before it picks the body reader (`slices.Equal(req.TransferEncoding,
// {"chunked"})`), so such a body is still read by net/http's chunked reader,
// not peerChunkedBody (f5642e8): the trailers the caller wrapped
// (Orbit-Padded: a padded value, or a field of that name) are not put back,
// and go upstream as the leg's own field, the caller's field empty; and
// trailers over net/http's 4 KiB read buffer fail ("suspiciously long
// trailer"), which the owner's own exchange and net/http send. Both an
// HTTP/1.1 and an h2c upstream.
func TestAdv47KnownLengthTrailersReadByOwner(t *testing.T) {
	big := strings.Repeat("b", 6000)
	cases := []struct {
		name string
		tr   http.Header
	}{
		{"padded", http.Header{"X-T": {" v "}}},
		{"leg-name", http.Header{"orbit-padded": {"x"}}},
		{"long", http.Header{"X-Big": {big}}},
	}
	for _, proto := range []string{"h1", "h2c"} {
		var mu sync.Mutex
		seen := map[string]string{}
		h := func(w http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			if k := r.URL.Query().Get("k"); k != "" {
				mu.Lock()
				seen[k] = fmt.Sprintf("CL=%d body=%q trailer=%q", r.ContentLength, b, r.Trailer)
				mu.Unlock()
			} else {
				io.WriteString(w, "ok")
			}
		}
		var owner, client *member
		var url string
		if proto == "h1" {
			up := httptest.NewServer(http.HandlerFunc(h))
			defer up.Close()
			url = up.URL
			owner, client = remotePair(t, nil)
			warm(t, owner, url+"/")
		} else {
			up := newH2CServer(t, h)
			url = up.url
			owner, client = h2Pair(t, url)
		}
		for _, c := range cases {
			for _, name := range []string{"owner", "sibling"} {
				rt := map[string]http.RoundTripper{"owner": owner.tr, "sibling": client.tr}[name]
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				req, _ := http.NewRequestWithContext(ctx, "POST", url+"/?k="+c.name+"-"+name, nil)
				req.Body = io.NopCloser(strings.NewReader("hello"))
				req.ContentLength = 5
				req.Trailer = c.tr.Clone()
				before := client.node.Stats().ReusedRemote
				o := roundTripOutcome(rt, req)
				cancel()
				if name == "sibling" && client.node.Stats().ReusedRemote == before {
					t.Fatalf("%s %s: not through the owner (%+v)", proto, c.name, client.node.Stats())
				}
				if o.err != "" || o.status != 200 {
					t.Errorf("%s %s through %s: %+v", proto, c.name, name, o)
				}
			}
			mu.Lock()
			if got, want := seen[c.name+"-sibling"], seen[c.name+"-owner"]; got != want {
				if len(want) > 200 {
					got, want = got[:min(len(got), 200)]+"...", want[:200]+"..."
				}
				t.Errorf("%s %s: upstream saw %s through the sibling; %s through the owner's own exchange", proto, c.name, got, want)
			}
			mu.Unlock()
		}
	}
}
