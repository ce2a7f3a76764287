package proxy

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/textproto"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/governor"
)

// adv68bHandler reads the request body whole, sends a 103 first when the
// path is /interim, and answers the body's length and hash.
func adv68bHandler(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/interim" {
		w.Header().Set("Link", "</a.css>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		w.Header().Del("Link")
	}
	h := sha256.New()
	n, err := io.Copy(h, r.Body)
	if err != nil {
		w.WriteHeader(500)
		return
	}
	fmt.Fprintf(w, "%d %s", n, hex.EncodeToString(h.Sum(nil)))
}

func adv68bWant(b []byte) string {
	s := sha256.Sum256(b)
	return fmt.Sprintf("%d %s", len(b), hex.EncodeToString(s[:]))
}

// orderWaits records the order in which WroteHeaders and OwnerWaited come,
// and each OwnerWaited.
type orderWaits struct {
	mu     sync.Mutex
	events []string
	owner  []time.Duration
}

func (o *orderWaits) WroteHeaders() { o.mu.Lock(); o.events = append(o.events, "wrote"); o.mu.Unlock() }
func (o *orderWaits) Retrying(refused bool) {
	o.mu.Lock()
	o.events = append(o.events, fmt.Sprintf("retry(%v)", refused))
	o.mu.Unlock()
}
func (o *orderWaits) WaitLeft() time.Duration { return 0 }
func (o *orderWaits) OwnerWaited(d time.Duration) {
	o.mu.Lock()
	o.events = append(o.events, "owner")
	o.owner = append(o.owner, d)
	o.mu.Unlock()
}
func (o *orderWaits) snapshot() (string, []time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return strings.Join(o.events, " "), append([]time.Duration(nil), o.owner...)
}

// TestAdv68bOwnersWaitToldOnceOnEveryPath: an owner whose one worker comes
// free ownerWait after a sibling's request arrives serves it, and the
// caller's watcher is told that wait exactly once, after the head's
// WroteHeaders, on every path that sends the accept: a GET (accept with the
// first response), a short POST whose body goes with its head, a long POST
// (flagBodyOnAccept: the accept goes out when the owner's writer wants the
// body), a POST with Expect: 100-continue, and a chunked POST; over
// HTTP/1.1 and h2c upstreams; with a 103 relayed ahead of the final head
// (relay1xx / relay1xxNoWait send the accept) to a caller that reads
// interim responses and to one that does not. The response is whole.
func TestAdv68bOwnersWaitToldOnceOnEveryPath(t *testing.T) {
	const ownerWait = 120 * time.Millisecond
	large := bytes.Repeat([]byte("0123456789abcdef"), 20<<10) // 320 KiB
	short := []byte("short body")
	for _, proto := range []string{"http1", "h2c"} {
		var base string
		conf := func(tr *Transport) { tr.MaxConnsPerKey = 1 }
		if proto == "h2c" {
			base = newH2CServer(t, adv68bHandler).url
			conf = func(tr *Transport) { h2cConf(tr); tr.MaxConnsPerKey = 1 }
		} else {
			ts := httptest.NewServer(http.HandlerFunc(adv68bHandler))
			t.Cleanup(ts.Close)
			base = ts.URL
		}
		gov := governor.New(1, 0)
		owner, client := budgetFleet(t, NodeOptions{Governor: gov, MaxLeaseWait: 5 * time.Second}, conf)
		warm(t, owner, base+"/plain")
		served := owner.node.Stats().ServedRemote
		for _, path := range []string{"/plain", "/interim"} {
			for _, readInterim := range []bool{false, true} {
				if path == "/plain" && readInterim {
					continue
				}
				for _, kind := range []string{"GET", "short", "large", "expect", "chunked"} {
					name := fmt.Sprintf("%s%s/%s/interim-hook=%v", proto, path, kind, readInterim)
					t.Run(name, func(t *testing.T) {
						var body []byte
						var req *http.Request
						ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
						defer cancel()
						w := &orderWaits{}
						ctx = WithWaitWatcher(ctx, w)
						var got1xx atomic.Int32
						if readInterim {
							ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{Got1xxResponse: func(code int, _ textproto.MIMEHeader) error {
								if code == http.StatusEarlyHints {
									got1xx.Add(1)
								}
								return nil
							}})
						}
						switch kind {
						case "GET":
							req, _ = http.NewRequestWithContext(ctx, "GET", base+path, nil)
						case "short":
							body = short
							req, _ = http.NewRequestWithContext(ctx, "POST", base+path, bytes.NewReader(body))
						case "large", "expect":
							body = large
							req, _ = http.NewRequestWithContext(ctx, "POST", base+path, bytes.NewReader(body))
							if kind == "expect" {
								req.Header.Set("Expect", "100-continue")
							}
						case "chunked":
							body = large
							req, _ = http.NewRequestWithContext(ctx, "POST", base+path, io.NopCloser(bytes.NewReader(body)))
							req.ContentLength = -1
						}
						releaseAfter(t, gov, ownerWait)
						start := time.Now()
						resp, err := client.tr.RoundTrip(req)
						if err != nil {
							t.Fatal(err)
						}
						b, err := io.ReadAll(resp.Body)
						resp.Body.Close()
						elapsed := time.Since(start)
						if err != nil || resp.StatusCode != 200 || string(b) != adv68bWant(body) {
							t.Fatalf("response %d %q %v, want %q", resp.StatusCode, b, err, adv68bWant(body))
						}
						if s := owner.node.Stats().ServedRemote; s != served+1 {
							t.Fatalf("owner served %d remote requests, want %d (setup)", s, served+1)
						}
						served++
						ev, ds := w.snapshot()
						if len(ds) != 1 {
							t.Fatalf("watcher told of the owner's wait %d times (%v; events %q), want once", len(ds), ds, ev)
						}
						if ds[0] < ownerWait*3/4 || ds[0] > elapsed {
							t.Errorf("watcher told the owner waited %v; it held the request about %v, and the round trip took %v", ds[0], ownerWait, elapsed)
						}
						if ev != "wrote owner" {
							t.Errorf("watcher events %q, want \"wrote owner\"", ev)
						}
						if readInterim && got1xx.Load() != 1 {
							t.Errorf("caller saw %d 103s, want 1", got1xx.Load())
						}
					})
				}
			}
		}
	}
}
