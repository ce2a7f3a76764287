package proxy

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"sync/atomic"
	"testing"
	"time"
)

// TestWroteHeadersOnEveryPath: the function WithWroteHeaders sets is called
// once a request's head is out and before its body is, on the worker's own
// connection and through a sibling, over HTTP/1.1 and h2c, with and
// without Expect: 100-continue. The second half of each upload is sent only
// once the function has been called, so a transport that called it with
// the body's end or with the response hangs the request until its
// deadline. The caller's own trace still sees WroteHeaders, once.
func TestWroteHeadersOnEveryPath(t *testing.T) {
	const half = 8 << 10
	answer := func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		fmt.Fprint(w, n)
	}
	for _, proto := range []string{"http1", "h2c"} {
		for _, path := range []string{"local", "remote"} {
			t.Run(proto+"/"+path, func(t *testing.T) {
				var url string
				var conf func(*Transport)
				if proto == "h2c" {
					url, conf = newH2CServer(t, answer).url, h2cConf
				} else {
					ts := httptest.NewServer(http.HandlerFunc(answer))
					t.Cleanup(ts.Close)
					url = ts.URL
				}
				var rt http.RoundTripper
				var owner *member
				if path == "local" {
					rt = localTransportMember(t, conf).tr
				} else {
					var client *member
					owner, client = remotePair(t, conf)
					warm(t, owner, url)
					rt = client.tr
				}
				for _, c := range []struct {
					name, method string
					expect       bool
				}{{"GET", "GET", false}, {"POST", "POST", false}, {"POST with Expect", "POST", true}} {
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					defer cancel()
					var hooks, own atomic.Int32
					wrote := make(chan struct{})
					ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{WroteHeaders: func() { own.Add(1) }})
					ctx = WithWroteHeaders(ctx, func() {
						if hooks.Add(1) == 1 {
							close(wrote)
						}
					})
					var body io.Reader
					want := "0"
					if c.method == "POST" {
						pr, pw := io.Pipe()
						go func() {
							pw.Write(make([]byte, half))
							select {
							case <-wrote:
								pw.Write(make([]byte, half))
								pw.Close()
							case <-ctx.Done():
								pw.CloseWithError(ctx.Err())
							}
						}()
						body, want = pr, fmt.Sprint(2*half)
					}
					req, err := http.NewRequestWithContext(ctx, c.method, url, body)
					if err != nil {
						t.Fatal(err)
					}
					if c.expect {
						req.Header.Set("Expect", "100-continue")
					}
					resp, err := rt.RoundTrip(req)
					if err != nil {
						t.Fatalf("%s: %v (WithWroteHeaders function called %d times)", c.name, err, hooks.Load())
					}
					b, err := io.ReadAll(resp.Body)
					resp.Body.Close()
					if err != nil || string(b) != want {
						t.Fatalf("%s: body %q, %v; want %q", c.name, b, err, want)
					}
					if hooks.Load() != 1 || own.Load() != 1 {
						t.Errorf("%s: WithWroteHeaders function called %d times, the caller's WroteHeaders %d; want 1 and 1", c.name, hooks.Load(), own.Load())
					}
				}
				if owner != nil {
					if s := owner.node.Stats(); s.ServedRemote < 3 {
						t.Errorf("the owner served %d of the sibling's requests, want 3: %+v", s.ServedRemote, s)
					}
				}
			})
		}
	}
}
