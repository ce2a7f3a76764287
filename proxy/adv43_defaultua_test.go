package proxy

import (
	"context"
	"net"
	"net/http"
	"reflect"
	"sync"
	"testing"
	"time"
)

// TestAdv43DefaultUserAgentH2LikeNetHTTP: a request with no User-Agent
// header to an HTTP/2 upstream. net/http's HTTP/2 client (x/net/http2)
// sends its default, "Go-http-client/2.0", and so does the owner's own
// exchange. Through a sibling the head crosses the unix leg written by
// http.Request.Write, which puts in HTTP/1.1's default ("Go-http-client/1.1")
// when the header is absent; the owner takes that as the caller's choice
// and the upstream gets another User-Agent than from net/http. wrapRequest
// writes an empty User-Agent for a moved one; an absent one is left to
// Request.Write's default.
func TestAdv43DefaultUserAgentH2LikeNetHTTP(t *testing.T) {
	var mu sync.Mutex
	var seen [][]string
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/ua" {
			mu.Lock()
			seen = append(seen, r.Header["User-Agent"])
			mu.Unlock()
		}
		w.Write([]byte("ok"))
	})
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	srv := &http.Server{Handler: h, Protocols: &p}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	defer srv.Close()
	url := "http://" + ln.Addr().String()
	owner, client := h2Pair(t, url)
	ref := refH2C()
	defer ref.CloseIdleConnections()
	names := []string{"x/net", "owner", "sibling"}
	for _, name := range names {
		rt := map[string]http.RoundTripper{"x/net": ref, "owner": owner.tr, "sibling": client.tr}[name]
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		req, _ := http.NewRequestWithContext(ctx, "GET", url+"/ua", nil)
		req.Header = http.Header{"X-P": {" padded"}}
		o := roundTripOutcome(rt, req)
		cancel()
		if o.err != "" || o.status != 200 {
			t.Fatalf("%s: %+v", name, o)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 3 {
		t.Fatalf("upstream saw %d requests; want 3", len(seen))
	}
	for i, name := range names[1:] {
		if !reflect.DeepEqual(seen[i+1], seen[0]) {
			t.Errorf("%s: upstream got User-Agent %q; net/http's HTTP/2 client sends %q", name, seen[i+1], seen[0])
		}
	}
	if n := client.node.Stats().ReusedRemote; n == 0 {
		t.Errorf("the sibling's request did not go through the owner (%+v)", client.node.Stats())
	}
}
