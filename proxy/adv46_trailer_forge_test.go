package proxy

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

// TestAdv46TrailerInvalidNameForgesAnotherField: a request trailer whose
// name is not a valid field name ("X-Forged |evil|", with a padded value)
// is refused before anything goes, as net/http refuses it. Sent through a
// sibling, the wrap would write "X-Forged |evil| | v|", which the owner's
// unwrap cuts at the first space: the upstream would get a trailer
// X-Forged that nobody set.
func TestAdv46TrailerInvalidNameForgesAnotherField(t *testing.T) {
	var hits atomic.Int32
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/warm" {
			hits.Add(1)
		}
		io.Copy(io.Discard, r.Body)
	}))
	defer up.Close()
	owner, client := remotePair(t, nil)
	warm(t, owner, up.URL+"/warm")
	for _, name := range []string{"net-http", "owner", "sibling"} {
		rt := map[string]http.RoundTripper{"net-http": http.DefaultTransport, "owner": owner.tr, "sibling": client.tr}[name]
		for _, tr := range []http.Header{{"X-Forged |evil|": {" v"}}, {"X-Ok": {"bad\r\nX-Forged: v"}}} {
			req, _ := http.NewRequest("POST", up.URL+"/"+name, io.NopCloser(strings.NewReader("body")))
			req.ContentLength = -1
			req.Trailer = tr
			if o := roundTripOutcome(rt, req); !strings.Contains(o.err, "invalid trailer field") {
				t.Errorf("%s, trailers %q: %+v; want the request refused for its trailer, as net/http refuses it", name, tr, o)
			}
		}
	}
	if n := hits.Load(); n != 0 {
		t.Errorf("the upstream saw %d of the refused requests", n)
	}
}
