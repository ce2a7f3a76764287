package proxy

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

// TestAdv43PaddedNameRequestHeadWithinOwnerLimit: a request head that
// net/http's own server takes under its default limit (1 MB: Caddy's too)
// and net/http's Transport sends as it is: 58000 fields "Orbit-Padded: x",
// 986 KB. The owner bounds a sibling's request head by peerHeadLimit, never
// less than that server default, so that what the sibling's server accepted
// crosses. But each value of a field named Orbit-Padded now crosses wrapped
// ("Orbit-Padded: Orbit-Padded |x|", 32 bytes for 17), and the head the
// owner reads is 1.86 MB: refused as over the owner's limit, where the
// local path and net/http send it. (Before the wrap the same head crossed.)
func TestAdv43PaddedNameRequestHeadWithinOwnerLimit(t *testing.T) {
	const n = 58000
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if got := len(r.Header[paddedField]); r.URL.Path == "/big" && got != n {
			w.WriteHeader(400)
		}
		w.Write([]byte("ok"))
	}))
	up.Config.MaxHeaderBytes = 8 << 20
	up.Start()
	defer up.Close()
	conf := func(tr *Transport) { tr.MaxResponseHeaderBytes = 64 << 10 }
	owner, client := remotePair(t, conf)
	warm(t, owner, up.URL+"/warm")
	vals := make([]string, n)
	for i := range vals {
		vals[i] = "x"
	}
	ref := &http.Transport{}
	defer ref.CloseIdleConnections()
	for _, name := range []string{"net/http", "owner", "sibling"} {
		rt := map[string]http.RoundTripper{"net/http": ref, "owner": owner.tr, "sibling": client.tr}[name]
		req, _ := http.NewRequest("GET", up.URL+"/big", nil)
		req.Header[paddedField] = vals
		o := roundTripOutcome(rt, req)
		if o.err != "" || o.status != 200 || o.body != "ok" {
			t.Errorf("%s: err %q status %d; want 200 \"ok\", the upstream given all %d values, as net/http", name, o.err, o.status, n)
		}
	}
	if n := client.node.Stats().ReusedRemote; n == 0 {
		t.Errorf("the sibling's request did not go through the owner (%+v)", client.node.Stats())
	}
}
