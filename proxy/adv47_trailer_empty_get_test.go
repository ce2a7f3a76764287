package proxy

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

// TestAdv47EmptyBodyGetWithTrailersFramedAsNetHTTP: a GET (DELETE, OPTIONS)
// with a body of unknown length that is empty, and trailers. net/http's
// Request.Write probes such a body, finds it empty, and sends the request
// without one: no Transfer-Encoding, and no trailers (they have no chunked
// body to ride in); the owner's own exchange does the same, and so must a
// sibling. A wrap that forced the copy chunked to skip the probe (96cba37)
// had the owner forward a chunked body: an HTTP/1.1 upstream got "GET ...
// Transfer-Encoding: chunked", which servers that refuse a body on a GET
// (or treat its framing differently) saw only through a sibling.
func TestAdv47EmptyBodyGetWithTrailersFramedAsNetHTTP(t *testing.T) {
	up, seen := framingRecorder(t)
	owner, client := remotePair(t, nil)
	warm(t, owner, up.URL+"/warm")

	for _, method := range []string{"GET", "DELETE", "OPTIONS"} {
		for _, name := range []string{"net/http", "owner", "sibling"} {
			rt := map[string]http.RoundTripper{"net/http": http.DefaultTransport, "owner": owner.tr, "sibling": client.tr}[name]
			req, _ := http.NewRequest(method, up.URL+"/?k="+method+"-"+name, nil)
			req.Body = io.NopCloser(strings.NewReader(""))
			req.ContentLength = 0 // unknown, with a body: net/http probes it
			req.Trailer = http.Header{"X-T": {"v"}}
			before := client.node.Stats().ReusedRemote
			o := roundTripOutcome(rt, req)
			if o.err != "" || o.status != 200 {
				t.Fatalf("%s %s: %+v", method, name, o)
			}
			if name == "sibling" && client.node.Stats().ReusedRemote == before {
				t.Fatalf("%s: the sibling's request did not go through the owner (%+v)", method, client.node.Stats())
			}
		}
		want := seen(method + "-net/http")
		for _, name := range []string{"owner", "sibling"} {
			if got := seen(method + "-" + name); got != want {
				t.Errorf("%s through %s: upstream saw %s; net/http sends %s", method, name, got, want)
			}
		}
	}
}
