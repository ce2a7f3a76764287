package proxy

import (
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"sync"
	"testing"
	"time"
)

// slowEOF is a request body with nothing in it that says so only after a
// while: net/http's Request.Write probes such a body of a GET on a goroutine
// of its own, and writes the head (and its Trailer field, from the request's
// Trailer keys) once 200ms have gone without an answer.
type slowEOF struct{ d time.Duration }

func (s slowEOF) Read(p []byte) (int, error) { time.Sleep(s.d); return 0, io.EOF }

// TestAdv46TrailerWrapRacesRequestWriteProbe: a GET with a body of unknown
// length and trailers the caller set before the request went (net/http's
// documented way), through a sibling. The trailers' wrap rewrites the
// Trailer map of the copy that Request.Write reads, from the body's Read at
// EOF: that Read runs on net/http's probe goroutine while the writer ranges
// over the same map for the Trailer field. net/http's own transport reads a
// map nobody writes. Run with -race: the detector reports the race (and a
// real overlap is a fatal "concurrent map iteration and map write").
func TestAdv46TrailerWrapRacesRequestWriteProbe(t *testing.T) {
	var mu sync.Mutex
	var seen []http.Header
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if r.URL.Path == "/probe" {
			mu.Lock()
			seen = append(seen, r.Trailer.Clone())
			mu.Unlock()
		}
	}))
	defer up.Close()
	owner, client := remotePair(t, nil)
	warm(t, owner, up.URL+"/warm")

	for _, name := range []string{"net/http", "sibling"} {
		rt := map[string]http.RoundTripper{"net/http": http.DefaultTransport, "sibling": client.tr}[name]
		req, _ := http.NewRequest("GET", up.URL+"/probe", nil)
		req.Body = io.NopCloser(slowEOF{250 * time.Millisecond})
		req.ContentLength = 0 // unknown, with a body: net/http probes it
		req.Trailer = http.Header{"X-T": {"v"}}
		o := roundTripOutcome(rt, req)
		if o.err != "" || o.status != 200 {
			t.Fatalf("%s: %+v", name, o)
		}
	}
	mu.Lock()
	if len(seen) != 2 || !reflect.DeepEqual(seen[0], seen[1]) || seen[0].Get("X-T") != "v" {
		t.Errorf("upstream saw trailers %q (net/http, then the sibling); want X-T from both", seen)
	}
	mu.Unlock()
	if n := client.node.Stats().ReusedRemote; n == 0 {
		t.Errorf("the sibling's request did not go through the owner (%+v)", client.node.Stats())
	}
}
