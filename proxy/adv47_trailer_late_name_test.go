package proxy

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
)

// lateTrailer is a body that, at its end, sets a trailer in tr: as a
// caller may until its body ends (net/http reads the values then).
type lateTrailer struct {
	r    io.Reader
	tr   http.Header
	k, v string
}

func (b *lateTrailer) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if err == io.EOF {
		b.tr[b.k] = []string{b.v}
	}
	return n, err
}

// TestAdv47LateTrailerNameNotForged: the trailers' names are checked in
// RoundTrip (057a111) so that the unix leg never carries a name with a space
// as another field; but a trailer set as the body ends is not checked, and
// its wrap (a padded value moves into Orbit-Padded as "<name> |<value>|")
// is cut at the name's first space by the owner's unwrapPadded. A caller's
// invalid name "X-A |inj|" with value " v" becomes a valid trailer
// "X-A: inj| | v" upstream. net/http's writer drops a field with an invalid
// name (Header.Write), so the upstream sees no X-A through it, nor through
// the owner's own exchange.
func TestAdv47LateTrailerNameNotForged(t *testing.T) {
	var mu sync.Mutex
	seen := map[string]http.Header{}
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if k := r.URL.Query().Get("k"); k != "" {
			mu.Lock()
			seen[k] = r.Trailer.Clone()
			mu.Unlock()
		}
	}))
	defer up.Close()
	owner, client := remotePair(t, nil)
	warm(t, owner, up.URL+"/warm")
	for _, name := range []string{"net/http", "owner", "sibling"} {
		rt := map[string]http.RoundTripper{"net/http": http.DefaultTransport, "owner": owner.tr, "sibling": client.tr}[name]
		req, _ := http.NewRequest("POST", up.URL+"/?k="+name, nil)
		req.Trailer = http.Header{"X-T": {"t"}}
		req.Body = io.NopCloser(&lateTrailer{r: strings.NewReader("hello"), tr: req.Trailer, k: "X-A |inj|", v: " v"})
		req.ContentLength = -1
		before := client.node.Stats().ReusedRemote
		o := roundTripOutcome(rt, req)
		if name == "sibling" && client.node.Stats().ReusedRemote == before {
			t.Fatalf("not through the owner (%+v)", client.node.Stats())
		}
		if o.err != "" || o.status != 200 {
			t.Fatalf("%s: %+v", name, o)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for _, name := range []string{"net/http", "owner", "sibling"} {
		if v, ok := seen[name]["X-A"]; ok {
			t.Errorf("through %s the upstream got a trailer X-A %q the caller never named (trailers %q)", name, v, seen[name])
		}
	}
}
