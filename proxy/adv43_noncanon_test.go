package proxy

import (
	"net/http"
	"net/http/httptest"
	"reflect"
	"sync"
	"testing"
)

// TestAdv43NonCanonicalPaddedNameNotUnwrapped: a caller may set a header
// under a non-canonical key (net/http documents assigning to the map for
// that), and net/http's Transport writes it as it is: a request whose
// header holds "orbit-padded: X-Injected |yes|" reaches the upstream with
// that one field and nothing else. wrapPadded moves only the canonical key
// "Orbit-Padded"; the lower-case one is written as it is, the owner's
// reader canonicalizes it, and unwrapPadded takes it for its own: the
// upstream gets a field X-Injected: yes that nobody sent, and loses the one
// that was sent. The same way a caller's key can make the owner send any
// other field (Connection: close, User-Agent, ...). And a value under that
// key that is no wrapped field ("plain") makes the owner refuse the head as
// malformed, where net/http sends the request.
func TestAdv43NonCanonicalPaddedNameNotUnwrapped(t *testing.T) {
	var mu sync.Mutex
	var seen []http.Header
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/fields" {
			mu.Lock()
			seen = append(seen, r.Header.Clone())
			mu.Unlock()
		}
		w.Write([]byte("ok"))
	}))
	defer up.Close()
	owner, client := remotePair(t, nil)
	warm(t, owner, up.URL+"/warm")
	ref := &http.Transport{}
	defer ref.CloseIdleConnections()
	for _, name := range []string{"net/http", "sibling"} {
		rt := map[string]http.RoundTripper{"net/http": ref, "sibling": client.tr}[name]
		req, _ := http.NewRequest("GET", up.URL+"/fields", nil)
		req.Header["orbit-padded"] = []string{"X-Injected |yes|"}
		o := roundTripOutcome(rt, req)
		if o.err != "" || o.status != 200 || o.body != "ok" {
			t.Fatalf("%s: %+v", name, o)
		}
	}
	for _, name := range []string{"net/http", "sibling"} {
		rt := map[string]http.RoundTripper{"net/http": ref, "sibling": client.tr}[name]
		req, _ := http.NewRequest("GET", up.URL+"/plain", nil)
		req.Header["orbit-padded"] = []string{"plain"}
		if o := roundTripOutcome(rt, req); o.err != "" || o.status != 200 || o.body != "ok" {
			t.Errorf("%s: a request with orbit-padded: plain: err %q status %d; want 200 \"ok\" as net/http", name, o.err, o.status)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 2 {
		t.Fatalf("upstream saw %d requests; want 2", len(seen))
	}
	if got := seen[0][paddedField]; !reflect.DeepEqual(got, []string{"X-Injected |yes|"}) {
		t.Fatalf("net/http sent %s %q", paddedField, got)
	}
	if got := seen[1]["X-Injected"]; got != nil {
		t.Errorf("through the sibling the upstream got X-Injected %q, a field nobody sent (net/http sends none)", got)
	}
	if got := seen[1][paddedField]; !reflect.DeepEqual(got, seen[0][paddedField]) {
		t.Errorf("through the sibling the upstream got %s %q; net/http sent %q", paddedField, got, seen[0][paddedField])
	}
	if n := client.node.Stats().ReusedRemote; n == 0 {
		t.Errorf("the sibling's request did not go through the owner (%+v)", client.node.Stats())
	}
}
