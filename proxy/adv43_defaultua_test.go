package proxy

import (
	"context"
	"net/http"
	"reflect"
	"testing"
)

// TestAdv43DefaultUserAgentH2LikeNetHTTP: a request with no User-Agent
// header to an HTTP/2 upstream. net/http's HTTP/2 client (x/net/http2)
// sends its default, "Go-http-client/2.0", and so does the owner's own
// exchange. Through a sibling the head crosses the unix leg written by
// http.Request.Write, which puts in HTTP/1.1's default ("Go-http-client/1.1")
// when the header is absent; the owner took that as the caller's choice
// and the upstream got another User-Agent than from net/http, until the
// frame said the field was absent (flagNoUserAgent).
func TestAdv43DefaultUserAgentH2LikeNetHTTP(t *testing.T) {
	url, seen := h2cRecorder(t)
	owner, client := h2Pair(t, url)
	outs := eachH2Path(owner, client, func(ctx context.Context) *http.Request {
		req, _ := http.NewRequestWithContext(ctx, "GET", url+"/ua", nil)
		req.Header = http.Header{"X-P": {" padded"}}
		return req
	})
	for name, o := range outs {
		if o.err != "" || o.status != 200 {
			t.Fatalf("%s: %+v", name, o)
		}
	}
	hs := seen()
	if len(hs) != 3 {
		t.Fatalf("upstream saw %d requests; want 3", len(hs))
	}
	for i, name := range h2Paths[1:] {
		if got, want := hs[i+1]["User-Agent"], hs[0]["User-Agent"]; !reflect.DeepEqual(got, want) {
			t.Errorf("%s: upstream got User-Agent %q; net/http's HTTP/2 client sends %q", name, got, want)
		}
	}
	if n := client.node.Stats().ReusedRemote; n == 0 {
		t.Errorf("the sibling's request did not go through the owner (%+v)", client.node.Stats())
	}
}
