package proxy

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
)

// TestAdv46LargeRequestTrailersLikeNetHTTP: request trailers of 6 KiB, which
// net/http's transport and the owner's own exchange send to an HTTP/1.1
// upstream that reads them (with a larger read buffer than net/http's
// server) reach it through a sibling too. net/http's reader of a chunked
// body, over the owner's 4 KiB stream buffer, refused any trailer section
// longer than that buffer ("suspiciously long trailer"), and the request
// failed as the owner gone. An HTTP/2 client may send Caddy trailers up to
// its header list limit (1 MB), and HTTP/2 upstreams take them.
func TestAdv46LargeRequestTrailersLikeNetHTTP(t *testing.T) {
	var mu sync.Mutex
	seen := map[string]int{}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReaderSize(c, 64<<10)
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					_, err = io.Copy(io.Discard, req.Body)
					mu.Lock()
					if err == nil {
						seen[req.URL.Path] = len(req.Trailer.Get("X-Big"))
					} else {
						seen[req.URL.Path] = -1
					}
					mu.Unlock()
					if err != nil {
						return
					}
					if _, err := io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"); err != nil {
						return
					}
				}
			}()
		}
	}()
	url := "http://" + ln.Addr().String()
	owner, client := remotePair(t, nil)
	warm(t, owner, url+"/warm")

	big := strings.Repeat("b", 6<<10)
	paths := []string{"net-http", "owner", "sibling"}
	outs := map[string]h2Outcome{}
	for _, name := range paths {
		rt := map[string]http.RoundTripper{"net-http": http.DefaultTransport, "owner": owner.tr, "sibling": client.tr}[name]
		req, _ := http.NewRequest("POST", url+"/"+name, nil)
		req.Body = io.NopCloser(strings.NewReader("body"))
		req.ContentLength = -1
		req.Trailer = http.Header{"X-Big": {big}}
		outs[name] = roundTripOutcome(rt, req)
	}
	mu.Lock()
	defer mu.Unlock()
	t.Logf("upstream saw %v; owner %+v", seen, owner.node.Stats())
	ref := outs["net-http"]
	if ref.err != "" || ref.status != 200 || seen["/net-http"] != len(big) {
		t.Fatalf("net/http: %+v, upstream saw %d bytes", ref, seen["/net-http"])
	}
	for _, name := range paths[1:] {
		o := outs[name]
		if o.err != "" || o.status != 200 || seen["/"+name] != len(big) {
			t.Errorf("%s: err %q status %d, upstream saw X-Big of %d bytes; net/http: status 200, %d bytes",
				name, o.err, o.status, seen["/"+name], len(big))
		}
	}
	if n := client.node.Stats().ReusedRemote; n == 0 {
		t.Errorf("the sibling's request did not go through the owner (%+v)", client.node.Stats())
	}
}
